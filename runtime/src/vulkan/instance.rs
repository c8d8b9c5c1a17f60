//! The Vulkan instance: optional validation and the debug messenger (the loader it calls:
//! `loader.rs`).

use std::ffi::{c_char, CStr};
use std::fmt;
use std::sync::Arc;

use ash::vk;

use super::adapter::{self, Adapter, DeviceChoice};
use super::debug::{self, Message, ValidationLog};
use super::loader;
use super::validated_turn::ValidatedTurn;
use crate::error::{vk_err, Error, Result};

/// The Khronos validation layer.
pub const VALIDATION_LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";
const VALIDATION_LAYER_NAME: &str = "VK_LAYER_KHRONOS_validation";

/// The newest Vulkan version vkfuse asks for; devices may be older (1.1 is the floor).
const TARGET_API: u32 = vk::API_VERSION_1_3;

/// How to create an [`Instance`].
#[derive(Clone, Debug, Default)]
pub struct InstanceOptions {
    /// Enable `VK_LAYER_KHRONOS_validation`. Also on when the environment has
    /// `VKFUSE_VALIDATION=1`. Failing to find the layer is an error, never silently skipped.
    pub validation: bool,
    /// Also enable the layer's synchronization validation (missing or wrong barriers); implies
    /// `validation`. Also on with `VKFUSE_SYNC_VALIDATION=1`. Slower.
    pub sync_validation: bool,
}

impl InstanceOptions {
    /// Validation on (what tests use).
    pub fn validated() -> Self {
        Self {
            validation: true,
            sync_validation: false,
        }
    }

    /// These options with the environment's `VKFUSE_VALIDATION` / `VKFUSE_SYNC_VALIDATION`.
    fn with_env(&self) -> Self {
        let on = |name: &str| std::env::var(name).is_ok_and(|v| v == "1");
        let sync_validation = self.sync_validation || on("VKFUSE_SYNC_VALIDATION");
        Self {
            validation: self.validation || sync_validation || on("VKFUSE_VALIDATION"),
            sync_validation,
        }
    }
}

/// A Vulkan instance. Cheap to clone (shared); devices and adapters keep it alive, so the debug
/// messenger outlives every device and sees the leak reports of `vkDestroyDevice`.
#[derive(Clone)]
pub struct Instance {
    pub(crate) shared: Arc<InstanceShared>,
}

pub(crate) struct InstanceShared {
    pub(crate) entry: ash::Entry,
    pub(crate) raw: ash::Instance,
    messenger: Option<(ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>,
    /// Kept here so the callback's user data stays valid until after `vkDestroyInstance`.
    pub(crate) log: ValidationLog,
    pub(crate) api_version: u32,
    /// Some exactly when the validation layer is on: held while the instance lives, given back
    /// after `vkDestroyInstance` (fields drop after `Drop::drop`), since validated instances
    /// take turns ([`ValidatedTurn`]).
    validation: Option<ValidatedTurn>,
}

impl fmt::Debug for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Instance")
            .field("api_version", &adapter::Version(self.shared.api_version))
            .field("validation", &self.shared.validation.is_some())
            .finish_non_exhaustive()
    }
}

impl Instance {
    /// Creates an instance (the Vulkan loader is loaded at run time, once per process:
    /// `loader.rs`).
    ///
    /// Errors: [`Error::NoVulkan`] when the loader or a driver is missing,
    /// [`Error::LayerMissing`] when validation is asked for but not installed.
    pub fn new(options: &InstanceOptions) -> Result<Self> {
        let options = options.with_env();
        // Before the layer is loaded: its global state is not safe against another thread.
        let turn = options.validation.then(ValidatedTurn::take).transpose()?;
        let entry = loader::entry().map_err(|e| Error::NoVulkan {
            reason: format!("cannot load libvulkan ({e})"),
        })?;

        // SAFETY: a global command with no preconditions.
        let loader_version = unsafe { entry.try_enumerate_instance_version() }
            .map_err(vk_err("vkEnumerateInstanceVersion"))?
            .unwrap_or(vk::API_VERSION_1_0);
        if loader_version < vk::API_VERSION_1_1 {
            return Err(Error::NoVulkan {
                reason: format!(
                    "the loader only offers Vulkan {}; vkfuse needs 1.1 or newer",
                    adapter::Version(loader_version)
                ),
            });
        }
        let api_version = loader_version.min(TARGET_API);

        let mut layers: Vec<*const c_char> = Vec::new();
        if options.validation {
            // SAFETY: a global command with no preconditions.
            let available = unsafe { entry.enumerate_instance_layer_properties() }
                .map_err(vk_err("vkEnumerateInstanceLayerProperties"))?;
            let found = available
                .iter()
                .any(|l| l.layer_name_as_c_str() == Ok(VALIDATION_LAYER));
            if !found {
                return Err(Error::LayerMissing {
                    layer: VALIDATION_LAYER_NAME,
                });
            }
            layers.push(VALIDATION_LAYER.as_ptr());
        }

        let mut available = instance_extensions(&entry, None)?;
        if options.validation {
            // The layer brings its own extensions (debug utils, validation features).
            available.extend(instance_extensions(&entry, Some(VALIDATION_LAYER))?);
        }
        let has = |name: &CStr| available.iter().any(|e| e.as_c_str() == name);
        let debug_utils = has(ash::ext::debug_utils::NAME);
        let portability = has(ash::khr::portability_enumeration::NAME);
        // Without the messenger, validation would print to stdout and the log would look clean.
        let missing_extension = if options.validation && !debug_utils {
            Some("VK_EXT_debug_utils (to read validation messages)")
        } else if options.sync_validation && !has(ash::ext::validation_features::NAME) {
            Some("VK_EXT_validation_features (for synchronization validation)")
        } else {
            None
        };
        if let Some(call) = missing_extension {
            return Err(Error::Vulkan {
                call,
                result: vk::Result::ERROR_EXTENSION_NOT_PRESENT,
            });
        }
        let validation_features = options.sync_validation;

        let mut extensions: Vec<*const c_char> = Vec::new();
        if debug_utils {
            extensions.push(ash::ext::debug_utils::NAME.as_ptr());
        }
        if portability {
            // Lists devices that are not fully conformant (MoltenVK); harmless elsewhere.
            extensions.push(ash::khr::portability_enumeration::NAME.as_ptr());
        }
        if validation_features {
            extensions.push(ash::ext::validation_features::NAME.as_ptr());
        }

        let log = ValidationLog::default();
        let app = vk::ApplicationInfo::default()
            .application_name(c"vkfuse")
            .engine_name(c"vkfuse")
            .api_version(api_version);
        let flags = if portability {
            vk::InstanceCreateFlags::ENUMERATE_PORTABILITY_KHR
        } else {
            vk::InstanceCreateFlags::empty()
        };
        let sync_features = [vk::ValidationFeatureEnableEXT::SYNCHRONIZATION_VALIDATION];
        let mut validation_info =
            vk::ValidationFeaturesEXT::default().enabled_validation_features(&sync_features);
        // Chained into the create info so messages of vkCreateInstance/vkDestroyInstance
        // (leaked devices) reach the log too.
        let mut create_messenger = debug::messenger_info(&log);
        let mut info = vk::InstanceCreateInfo::default()
            .application_info(&app)
            .enabled_layer_names(&layers)
            .enabled_extension_names(&extensions)
            .flags(flags);
        if debug_utils {
            info = info.push_next(&mut create_messenger);
        }
        if validation_features {
            info = info.push_next(&mut validation_info);
        }

        // SAFETY: every pointer in `info` points into locals that outlive the call.
        let raw = unsafe { entry.create_instance(&info, None) }.map_err(|r| match r {
            vk::Result::ERROR_INCOMPATIBLE_DRIVER => Error::NoVulkan {
                reason: "the loader found no Vulkan driver (ICD)".into(),
            },
            vk::Result::ERROR_LAYER_NOT_PRESENT => Error::LayerMissing {
                layer: VALIDATION_LAYER_NAME,
            },
            r => Error::vk("vkCreateInstance", r),
        })?;

        let messenger = if debug_utils {
            let loader = ash::ext::debug_utils::Instance::new(&entry, &raw);
            let info = debug::messenger_info(&log);
            // SAFETY: the instance is live and was created with VK_EXT_debug_utils; the user data
            // (the log) is owned by `InstanceShared`, which destroys the messenger first.
            match unsafe { loader.create_debug_utils_messenger(&info, None) } {
                Ok(m) => Some((loader, m)),
                Err(r) => {
                    // SAFETY: nothing was created from the instance yet.
                    unsafe { raw.destroy_instance(None) };
                    return Err(Error::vk("vkCreateDebugUtilsMessengerEXT", r));
                }
            }
        } else {
            None
        };

        Ok(Instance {
            shared: Arc::new(InstanceShared {
                entry,
                raw,
                messenger,
                log,
                api_version,
                validation: turn,
            }),
        })
    }

    /// Whether `VK_LAYER_KHRONOS_validation` is on.
    pub fn validation_enabled(&self) -> bool {
        self.shared.validation.is_some()
    }

    /// The instance's Vulkan version (the loader's, capped at 1.3).
    pub fn api_version(&self) -> adapter::Version {
        adapter::Version(self.shared.api_version)
    }

    /// The shared log of ERROR and WARNING messages; keep a clone to read it after the instance
    /// and its devices are dropped.
    pub fn validation_log(&self) -> ValidationLog {
        self.shared.log.clone()
    }

    /// Validation errors so far (empty when clean, or when validation is off).
    pub fn validation_errors(&self) -> Vec<Message> {
        self.shared.log.errors()
    }

    /// Every physical device, in the driver's order (the index used by `--device` and
    /// `VKFUSE_DEVICE`).
    pub fn adapters(&self) -> Result<Vec<Adapter>> {
        // SAFETY: the instance is live.
        let raw = unsafe { self.shared.raw.enumerate_physical_devices() }.map_err(|r| match r {
            // What the loader answers when no driver (ICD) could be loaded.
            vk::Result::ERROR_INITIALIZATION_FAILED | vk::Result::ERROR_INCOMPATIBLE_DRIVER => {
                Error::NoDevice
            }
            r => Error::vk("vkEnumeratePhysicalDevices", r),
        })?;
        Ok(raw
            .into_iter()
            .enumerate()
            .map(|(index, pd)| Adapter::query(&self.shared, pd, index))
            .collect())
    }

    /// Picks an adapter: `index` if given, else `VKFUSE_DEVICE` (an index or part of a name),
    /// else the first discrete GPU, then integrated, virtual, CPU.
    pub fn select_adapter(&self, index: Option<usize>) -> Result<Adapter> {
        self.choose_adapter(index.map(DeviceChoice::Index).as_ref())
    }

    /// [`Self::select_adapter`] with the choice an index or part of a name (the CLI's
    /// `--device`, which errors name).
    pub fn choose_adapter(&self, choice: Option<&DeviceChoice>) -> Result<Adapter> {
        let mut adapters = self.adapters()?;
        let env = std::env::var("VKFUSE_DEVICE").ok();
        let infos: Vec<_> = adapters.iter().map(|a| a.info().clone()).collect();
        let chosen = adapter::pick(&infos, choice, env.as_deref())?;
        Ok(adapters.swap_remove(chosen))
    }

    /// The `ash` instance, for what this crate does not wrap.
    pub fn raw(&self) -> &ash::Instance {
        &self.shared.raw
    }

    /// The `ash` entry (loader functions).
    pub fn entry(&self) -> &ash::Entry {
        &self.shared.entry
    }
}

/// The instance extensions the loader lists (`layer`'s own where given).
pub(super) fn instance_extensions(
    entry: &ash::Entry,
    layer: Option<&CStr>,
) -> Result<Vec<std::ffi::CString>> {
    // SAFETY: a global command; `layer` is a valid NUL-terminated name when given.
    let props = unsafe { entry.enumerate_instance_extension_properties(layer) }
        .map_err(vk_err("vkEnumerateInstanceExtensionProperties"))?;
    Ok(props
        .iter()
        .filter_map(|p| p.extension_name_as_c_str().ok().map(CStr::to_owned))
        .collect())
}

impl Drop for InstanceShared {
    fn drop(&mut self) {
        if let Some((loader, messenger)) = self.messenger.take() {
            // SAFETY: every device holds an `Arc<InstanceShared>`, so none is left; the messenger
            // belongs to this instance and is destroyed once.
            unsafe { loader.destroy_debug_utils_messenger(messenger, None) };
        }
        // SAFETY: the last user of the instance is gone (see above); destroyed once. Messages
        // of this call still reach the log through the messenger chained at creation, whose
        // user data (`self.log`) is dropped only after this body.
        unsafe { self.raw.destroy_instance(None) };
    }
}
