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

/// The process's loader, loaded on first use; also keeps the drivers loaded (see above).
/// Errors: why libvulkan could not be loaded.
pub(crate) fn entry() -> Result<ash::Entry, ash::LoadingError> {
    static LOADER: Mutex<Option<ash::Entry>> = Mutex::new(None);
    let mut loader = lock(&LOADER);
    if let Some(entry) = loader.as_ref() {
        return Ok(entry.clone());
    }
    // SAFETY: loading libvulkan runs its initialisers; the Vulkan loader is a well-behaved
    // library, and the clone kept here holds it loaded for the rest of the process.
    let entry = unsafe { ash::Entry::load() }?;
    keep_drivers_loaded(&entry);
    *loader = Some(entry.clone());
    Ok(entry)
}

/// Creates the bare instance that is never destroyed. Without a driver it fails, and the
/// caller's own instance then reports the reason.
fn keep_drivers_loaded(entry: &ash::Entry) {
    // Vulkan 1.0, no layer, no extension: what any loader accepts.
    let app = vk::ApplicationInfo::default().application_name(c"vkfuse: drivers kept loaded");
    let info = vk::InstanceCreateInfo::default().application_info(&app);
    // SAFETY: `info` points into locals that outlive the call. The instance is never
    // destroyed on purpose (`ash::Instance` has no destructor); the process's end frees it.
    let _kept = unsafe { entry.create_instance(&info, None) };
}
