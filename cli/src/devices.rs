//! `vkfuse devices`: what Vulkan sees, with the limits that matter to vkfuse.

use anyhow::Result;
use std::io::Write;
use vkfuse_runtime::{Instance, InstanceOptions};

pub fn list() -> Result<()> {
    let instance = Instance::new(&InstanceOptions::default())?;
    let adapters = instance.adapters()?;
    let chosen = instance.select_adapter(None).map(|a| a.index()).ok();
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
    Ok(())
}
