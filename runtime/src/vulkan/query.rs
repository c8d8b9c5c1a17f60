//! Timestamp queries: GPU time, in nanoseconds through `timestampPeriod`.

use std::fmt;
use std::sync::Arc;

use ash::vk;

use super::device::{Device, DeviceShared};
use crate::error::{vk_err, Error, Result};

/// A pool of timestamp queries. Reset it in a command buffer
/// ([`reset_timestamps`](crate::CommandRecorder::reset_timestamps)) or from the host
/// ([`TimestampPool::reset_on_host`]), write timestamps, then read them once the submission
/// finished.
pub struct TimestampPool {
    pub(crate) inner: Arc<QueryInner>,
}

pub(crate) struct QueryInner {
    pub(crate) raw: vk::QueryPool,
    pub(crate) count: u32,
    period_ns: f64,
    /// Ticks wrap at `timestampValidBits`; differences are taken modulo this mask.
    mask: u64,
    pub(crate) shared: Arc<DeviceShared>,
}

impl fmt::Debug for TimestampPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TimestampPool")
            .field("count", &self.inner.count)
            .field("period_ns", &self.inner.period_ns)
            .finish()
    }
}

impl Drop for QueryInner {
    fn drop(&mut self) {
        // SAFETY: command buffers using the pool hold this Arc, so none is pending; destroyed once.
        unsafe { self.shared.raw.destroy_query_pool(self.raw, None) };
    }
}

impl Device {
    /// A pool of `count` timestamps, or `None` when the compute queue has no timestamps (then
    /// GPU time is unknown, reported as null).
    pub fn create_timestamp_pool(&self, count: u32) -> Result<Option<TimestampPool>> {
        let info = &self.shared.info;
        if !info.timestamps() {
            return Ok(None);
        }
        if count == 0 {
            return Err(Error::InvalidArgument(
                "a timestamp pool of 0 queries".into(),
            ));
        }
        let create = vk::QueryPoolCreateInfo::default()
            .query_type(vk::QueryType::TIMESTAMP)
            .query_count(count);
        // SAFETY: the device is live.
        let raw = unsafe { self.shared.raw.create_query_pool(&create, None) }
            .map_err(vk_err("vkCreateQueryPool"))?;
        let bits = info.timestamp_valid_bits;
        Ok(Some(TimestampPool {
            inner: Arc::new(QueryInner {
                raw,
                count,
                period_ns: f64::from(info.timestamp_period_ns),
                mask: if bits >= 64 {
                    u64::MAX
                } else {
                    (1u64 << bits) - 1
                },
                shared: Arc::clone(&self.shared),
            }),
        }))
    }
}

impl TimestampPool {
    /// Resets every query from the host, where the device enabled `hostQueryReset`, and says
    /// whether it did (false: reset it in a command buffer instead). No submission using the
    /// pool may still be pending.
    pub fn reset_on_host(&self) -> bool {
        let inner = &self.inner;
        if !inner.shared.enabled.host_query_reset {
            return false;
        }
        // SAFETY: the feature is enabled; the whole pool's range; the caller guarantees no
        // pending submission uses it.
        unsafe { inner.shared.raw.reset_query_pool(inner.raw, 0, inner.count) };
        true
    }

    /// Number of queries.
    pub fn count(&self) -> u32 {
        self.inner.count
    }

    /// Nanoseconds per tick (`timestampPeriod`).
    pub fn period_ns(&self) -> f64 {
        self.inner.period_ns
    }

    /// Raw ticks of queries `first..first + n`; `None` for a query not written yet (reset but
    /// not reached, or its submission still running). Never blocks.
    pub fn ticks(&self, first: u32, n: u32) -> Result<Vec<Option<u64>>> {
        let inner = &self.inner;
        if u64::from(first) + u64::from(n) > u64::from(inner.count) {
            return Err(Error::InvalidArgument(format!(
                "timestamps {first}..{first}+{n} of a pool of {}",
                inner.count
            )));
        }
        if n == 0 {
            return Ok(Vec::new());
        }
        // [value, availability] per query.
        let mut data = vec![[0u64; 2]; n as usize];
        let flags = vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WITH_AVAILABILITY;
        // SAFETY: the range is inside the pool; `data` holds n * 2 u64 with a 16-byte stride,
        // which is what TYPE_64 | WITH_AVAILABILITY writes; no WAIT, so this cannot hang on a
        // query that is never written.
        let result = unsafe {
            inner
                .shared
                .raw
                .get_query_pool_results(inner.raw, first, &mut data, flags)
        };
        match result {
            // NOT_READY: some are unavailable; the availability words say which.
            Ok(()) | Err(vk::Result::NOT_READY) => {}
            Err(r) => return Err(Error::vk("vkGetQueryPoolResults", r)),
        }
        Ok(data
            .iter()
            .map(|[value, available]| (*available != 0).then_some(*value & inner.mask))
            .collect())
    }

    /// Nanoseconds from timestamp `start` to timestamp `end`; `None` while either is unwritten.
    pub fn elapsed_ns(&self, start: u32, end: u32) -> Result<Option<f64>> {
        let a = self.ticks(start, 1)?;
        let b = self.ticks(end, 1)?;
        Ok(
            match (a.first().copied().flatten(), b.first().copied().flatten()) {
                (Some(a), Some(b)) => {
                    let ticks = b.wrapping_sub(a) & self.inner.mask;
                    Some(ticks as f64 * self.inner.period_ns)
                }
                _ => None,
            },
        )
    }

    /// The Vulkan handle.
    pub fn raw(&self) -> vk::QueryPool {
        self.inner.raw
    }
}
