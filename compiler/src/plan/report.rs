//! The plan's text form: the arena against its lower bound and against no planning, then one
//! line per buffer. Used by snapshots, `--explain` and `vkfuse inspect`.

use super::Plan;
use std::fmt;

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "buffer plan: {} buffers, align {}",
            self.offsets.len(),
            self.align
        )?;
        write!(f, "  arena       {:>12} bytes", self.arena_bytes)?;
        if self.lower_bound > 0 {
            // Integer thousandths so the text is the same on every platform.
            let milli = u128::from(self.arena_bytes) * 1000 / u128::from(self.lower_bound);
            write!(
                f,
                "  ({}.{:03}x the lower bound)",
                milli / 1000,
                milli % 1000
            )?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "  lower bound {:>12} bytes  (peak live bytes)",
            self.lower_bound
        )?;
        write!(f, "  naive       {:>12} bytes", self.naive_bytes)?;
        let saved = self.naive_bytes.saturating_sub(self.arena_bytes);
        if self.naive_bytes > 0 {
            let permille = u128::from(saved) * 1000 / u128::from(self.naive_bytes);
            write!(
                f,
                "  (saved {saved} bytes, {}.{}%)",
                permille / 10,
                permille % 10
            )?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "  {:>6} {:>12} {:>12}  live",
            "buffer", "offset", "bytes"
        )?;
        for (i, (offset, r)) in self.offsets.iter().zip(&self.requests).enumerate() {
            writeln!(
                f,
                "  {i:>6} {offset:>12} {:>12}  {}..={}",
                r.bytes, r.first, r.last
            )?;
        }
        Ok(())
    }
}
