//! Validated instances take turns: one thread at a time in a process holds validated Vulkan
//! instances.
//!
//! Why: the Khronos validation layer (1.3.239, Debian 12's) keeps the data of every instance
//! and device in one process-wide hash map that it does not lock. Creating or destroying an
//! instance or device on one thread while another thread calls through the layer can read a
//! freed node: seen as a segfault inside the layer (`vkDestroyInstance` on one test thread,
//! `vkResetFences` on another), about once in 500 runs of a test binary whose tests each make
//! their own validated instance, and as CI's one failed run. Instances without the layer (every
//! run outside the tests and `VKFUSE_VALIDATION`) do not take turns.
//!
//! The turn is taken before `vkCreateInstance` and given back after `vkDestroyInstance` (an
//! instance outlives its devices), by whichever thread drops the instance. It is reentrant on
//! one thread, which may hold several validated instances at once. A thread that waits longer
//! than [`WAIT`] gets an error instead of a hang (another thread keeps its validated instance
//! alive, e.g. in a static). Tested with real instances: runtime/tests/validated_turn.rs.

use std::sync::{Condvar, Mutex};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How long a thread waits for the turn before giving up.
pub(crate) const WAIT: Duration = Duration::from_secs(600);

/// The thread whose turn it is and how many validated instances it holds.
static TURN: Mutex<Option<(ThreadId, usize)>> = Mutex::new(None);
static GIVEN_BACK: Condvar = Condvar::new();

/// One validated instance's share of the turn; dropping it gives that share back.
#[derive(Debug)]
pub(crate) struct ValidatedTurn(());

impl ValidatedTurn {
    /// Waits (at most [`WAIT`]) until no other thread holds a validated instance.
    pub(crate) fn take() -> Result<ValidatedTurn> {
        let me = thread::current().id();
        let start = Instant::now();
        // A thread that panicked while holding the lock left the state consistent (every
        // update is one assignment), so a poisoned lock is used as is.
        let mut turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            match turn.as_mut() {
                None => {
                    *turn = Some((me, 1));
                    return Ok(ValidatedTurn(()));
                }
                Some((owner, held)) if *owner == me => {
                    *held += 1;
                    return Ok(ValidatedTurn(()));
                }
                Some(_) => {
                    let left = WAIT.saturating_sub(start.elapsed());
                    if left.is_zero() {
                        return Err(Error::ValidationBusy { waited: WAIT });
                    }
                    turn = GIVEN_BACK
                        .wait_timeout(turn, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
    }
}

impl Drop for ValidatedTurn {
    fn drop(&mut self) {
        let mut turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, held)) = turn.as_mut() {
            *held -= 1;
            if *held == 0 {
                *turn = None;
                GIVEN_BACK.notify_all();
            }
        }
    }
}
