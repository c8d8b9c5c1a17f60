//! The Vulkan loader, loaded once per process and kept, with the drivers it loads.
//!
//! The loader opens each driver (ICD) library for every instance it creates, and for every
//! extension query, and closes it again when done. NVIDIA's driver brings a library with
//! static (initial-exec) TLS, whose block glibc does not give back when it is closed: on an
//! H200 (driver 580, glibc 2.39) the 30th instance of one process found no driver
//! ("libnvidia-tls.so: cannot allocate memory in static TLS block"). Any process that opens
//! sessions one after another (a test binary, a server loading models in turn) would meet it.
//! So the process's first instance is a bare one that is never destroyed: it holds the
//! drivers open, and every later open is only a reference count.

use std::sync::Mutex;

use ash::vk;

use super::device::lock;

struct Loader {
    entry: ash::Entry,
    /// Whether the bare instance exists; tried again by every call until it does.
    drivers_kept: bool,
}

/// The process's loader, loaded on first use; also keeps the drivers loaded (see above).
/// Errors: why libvulkan could not be loaded.
pub(crate) fn entry() -> Result<ash::Entry, ash::LoadingError> {
    static LOADER: Mutex<Option<Loader>> = Mutex::new(None);
    let mut guard = lock(&LOADER);
    let loader = match guard.take() {
        Some(loader) => loader,
        // SAFETY: loading libvulkan runs its initialisers; the Vulkan loader is a well-behaved
        // library, and the `Entry` kept here holds it loaded for the rest of the process.
        None => Loader {
            entry: unsafe { ash::Entry::load() }?,
            drivers_kept: false,
        },
    };
    let loader = guard.insert(loader);
    if !loader.drivers_kept {
        loader.drivers_kept = keep_drivers_loaded(&loader.entry);
    }
    Ok(loader.entry.clone())
}

/// Creates the bare instance that is never destroyed; false where it could not (no driver
/// now: the caller's own instance then reports why, and the next call tries again).
fn keep_drivers_loaded(entry: &ash::Entry) -> bool {
    // Vulkan 1.0, no layer, and no extension but portability enumeration where the loader
    // has it: without it the loader would not open drivers listed only through it (MoltenVK),
    // which `Instance::new` does open.
    let portability = ash::khr::portability_enumeration::NAME;
    // The query opens and closes the drivers once more (one static TLS block on NVIDIA, as an
    // instance would take), only until the bare instance exists.
    let listed = super::instance::instance_extensions(entry, None)
        .unwrap_or_default()
        .iter()
        .any(|e| e.as_c_str() == portability);
    let extensions = [portability.as_ptr()];
    let app = vk::ApplicationInfo::default().application_name(c"vkfuse: drivers kept loaded");
    let mut info = vk::InstanceCreateInfo::default().application_info(&app);
    if listed {
        info = info
            .enabled_extension_names(&extensions)
            .flags(vk::InstanceCreateFlags::ENUMERATE_PORTABILITY_KHR);
    }
    // SAFETY: `info` points into locals that outlive the call. The instance is never
    // destroyed on purpose (`ash::Instance` has no destructor); the process's end frees it.
    unsafe { entry.create_instance(&info, None) }.is_ok()
}
