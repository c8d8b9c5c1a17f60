//! The pipeline cache file: driver-compiled pipelines kept between runs, so a second load of a
//! schedule skips the driver's shader compilation.
//!
//! Where: beside the schedule (`FILE.vkf` -> `FILE.vkf.pipelines`), or, when that folder is not
//! writable or the schedule has no file, in the user's cache folder (`$XDG_CACHE_HOME/vkfuse`,
//! else `~/.cache/vkfuse`) under the schedule's checksum.
//!
//! The file starts with our own header: a magic, the device's vendor and device ids, driver
//! version and `pipelineCacheUUID` (what Vulkan's own header checks), the schedule's pipeline
//! checksum, the data's length and CRC-32. A file for another device, driver or schedule is
//! not used (and is replaced); a damaged one is ignored with a warning. The cache can only
//! make loading faster: no cache problem ever fails a load.

use crate::schedule::{crc32, Schedule};
use crate::AdapterInfo;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"VKFPIPE1";
const HEADER: usize = 8 + 4 * 3 + 16 + 8 + 8 + 4;

/// What Vulkan's own pipeline cache header checks: data is valid only for the same device,
/// driver and `pipelineCacheUUID`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceKey {
    /// PCI vendor id.
    pub vendor_id: u32,
    /// PCI device id.
    pub device_id: u32,
    /// The driver's packed version.
    pub driver_version: u32,
    /// `pipelineCacheUUID`.
    pub uuid: [u8; 16],
}

impl DeviceKey {
    /// The key of `info`'s device and driver.
    pub fn of(info: &AdapterInfo) -> DeviceKey {
        DeviceKey {
            vendor_id: info.vendor_id,
            device_id: info.device_id,
            driver_version: info.driver_version,
            uuid: info.pipeline_cache_uuid,
        }
    }
}

/// The checksum of everything the schedule's pipelines are built from.
pub fn schedule_checksum(s: &Schedule) -> u64 {
    let mut lo = crc32::Crc32::new();
    let mut hi = crc32::Crc32::new();
    for k in &s.kernels {
        for part in [
            bytemuck::cast_slice::<u32, u8>(&k.spirv),
            bytemuck::cast_slice(&k.spec_constants),
            &k.bindings.to_le_bytes(),
            &k.push_constant_bytes.to_le_bytes(),
            &k.subgroups.unwrap_or(0).to_le_bytes(),
        ] {
            lo.update(&(part.len() as u64).to_le_bytes());
            lo.update(part);
        }
        hi.update(k.label.as_bytes());
    }
    u64::from(hi.finish()) << 32 | u64::from(lo.finish())
}

/// What happened to the pipeline cache file at load.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum CacheStatus {
    /// No cache file was asked for.
    #[default]
    Off,
    /// Pipelines were created from the file's data.
    Used(PathBuf),
    /// No usable file (none yet, or for another device, driver or schedule): pipelines were
    /// compiled and the file written.
    Written(PathBuf),
    /// The cache could not be read or written; loading went on without it.
    Ignored {
        /// The file.
        path: PathBuf,
        /// Why.
        warning: String,
    },
}

impl CacheStatus {
    /// A warning to show the user, if any.
    pub fn warning(&self) -> Option<String> {
        match self {
            CacheStatus::Ignored { path, warning } => Some(format!(
                "warning: pipeline cache {} not used: {warning}",
                path.display()
            )),
            _ => None,
        }
    }
}

/// Where a schedule's pipeline cache lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheFile {
    /// Tried first (beside the schedule, or the user cache file).
    pub primary: PathBuf,
    /// Used when `primary` cannot be written.
    pub fallback: Option<PathBuf>,
}

/// The user's cache folder for vkfuse: `$XDG_CACHE_HOME/vkfuse`, else `~/.cache/vkfuse`.
pub fn user_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("vkfuse"))
}

impl CacheFile {
    /// `FILE.pipelines` beside the schedule file, falling back to the user cache folder.
    pub fn beside(schedule_file: &Path, checksum: u64) -> CacheFile {
        let mut name = schedule_file.as_os_str().to_owned();
        name.push(".pipelines");
        CacheFile {
            primary: PathBuf::from(name),
            fallback: CacheFile::in_user_cache(checksum).map(|c| c.primary),
        }
    }

    /// `<user cache>/<checksum>.pipelines`, for schedules without a file.
    pub fn in_user_cache(checksum: u64) -> Option<CacheFile> {
        Some(CacheFile {
            primary: user_cache_dir()?.join(format!("{checksum:016x}.pipelines")),
            fallback: None,
        })
    }

    /// The cached data for `device` and `checksum`: `Ok(None)` if there is no file or it was
    /// made for another device, driver or schedule; `Err` (a warning) if it is damaged.
    pub fn read(
        &self,
        device: &DeviceKey,
        checksum: u64,
    ) -> (Option<PathBuf>, Result<Option<Vec<u8>>, String>) {
        for path in std::iter::once(&self.primary).chain(&self.fallback) {
            match std::fs::read(path) {
                Ok(bytes) => return (Some(path.clone()), decode(&bytes, device, checksum)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return (Some(path.clone()), Err(format!("cannot read it: {e}"))),
            }
        }
        (None, Ok(None))
    }

    /// Writes `data` (atomically: a temporary file renamed), beside the schedule if possible,
    /// else in the fallback; returns the path written.
    pub fn write(&self, device: &DeviceKey, checksum: u64, data: &[u8]) -> Result<PathBuf, String> {
        let bytes = encode(device, checksum, data);
        let mut last = String::new();
        for path in std::iter::once(&self.primary).chain(&self.fallback) {
            match write_atomic(path, &bytes) {
                Ok(()) => return Ok(path.clone()),
                Err(e) => last = format!("cannot write {}: {e}", path.display()),
            }
        }
        Err(last)
    }
}

fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

fn encode(device: &DeviceKey, checksum: u64, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&device.vendor_id.to_le_bytes());
    out.extend_from_slice(&device.device_id.to_le_bytes());
    out.extend_from_slice(&device.driver_version.to_le_bytes());
    out.extend_from_slice(&device.uuid);
    out.extend_from_slice(&checksum.to_le_bytes());
    out.extend_from_slice(&(data.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32::checksum(data).to_le_bytes());
    out.extend_from_slice(data);
    out
}

fn decode(bytes: &[u8], device: &DeviceKey, checksum: u64) -> Result<Option<Vec<u8>>, String> {
    if bytes.len() < HEADER || &bytes[..8] != MAGIC {
        return Err("not a vkfuse pipeline cache (bad magic or too short)".into());
    }
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes"));
    let same_device = u32_at(8) == device.vendor_id
        && u32_at(12) == device.device_id
        && u32_at(16) == device.driver_version
        && bytes[20..36] == device.uuid;
    if !same_device || u64_at(36) != checksum {
        return Ok(None); // another device, driver or schedule: rebuilt and replaced
    }
    let len = u64_at(44);
    let data = &bytes[HEADER..];
    if data.len() as u64 != len {
        return Err(format!(
            "truncated: {} data bytes, the header says {len}",
            data.len()
        ));
    }
    let (stored, computed) = (u32_at(52), crc32::checksum(data));
    if stored != computed {
        return Err(format!(
            "checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
        ));
    }
    Ok(Some(data.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device() -> DeviceKey {
        DeviceKey {
            vendor_id: 0x10de,
            device_id: 0x2330,
            driver_version: 5,
            uuid: [7; 16],
        }
    }

    #[test]
    fn a_cache_file_round_trips_for_the_same_device_and_schedule() {
        let bytes = encode(&device(), 42, b"driver data");
        assert_eq!(
            decode(&bytes, &device(), 42),
            Ok(Some(b"driver data".to_vec()))
        );
    }

    #[test]
    fn another_device_driver_or_schedule_is_not_used() {
        let bytes = encode(&device(), 42, b"driver data");
        assert_eq!(decode(&bytes, &device(), 43), Ok(None));
        let mut other = device();
        other.uuid[0] = 8;
        assert_eq!(decode(&bytes, &other, 42), Ok(None));
        other = device();
        other.driver_version = 1;
        assert_eq!(decode(&bytes, &other, 42), Ok(None));
    }

    #[test]
    fn damaged_cache_files_are_reported_not_used() {
        let mut bytes = encode(&device(), 42, b"driver data");
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        assert!(decode(&bytes, &device(), 42)
            .unwrap_err()
            .contains("checksum"));
        assert!(decode(&bytes[..HEADER + 3], &device(), 42)
            .unwrap_err()
            .contains("truncated"));
        assert!(decode(b"garbage", &device(), 42)
            .unwrap_err()
            .contains("magic"));
    }
}
