//! `vkfuse devices`: what Vulkan sees, with the limits that matter to vkfuse.

use anyhow::Result;
use std::io::Write;
use vkfuse_runtime::{Instance, InstanceOptions};

pub fn list() -> Result<()> {
    let instance = Instance::new(&InstanceOptions::default())?;
    let adapters = instance.adapters()?;
    let selected = instance.select_adapter(None).map(|a| a.index());
    let chosen = selected.as_ref().ok().copied();
    for a in &adapters {
        let mark = if Some(a.index()) == chosen {
            " (default)"
        } else {
            ""
        };
        writeln!(
            std::io::stdout().lock(),
            "device {}{mark}: {}",
            a.index(),
            a.info()
        )?;
    }
    // A VKFUSE_DEVICE that names none of them: every command that opens a device refuses it,
    // so the list says so instead of marking no default in silence.
    if let Err(e) = selected {
        eprintln!("note: no device is the default: {e}");
    }
    Ok(())
}
