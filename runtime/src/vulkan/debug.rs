//! `VK_EXT_debug_utils`: the messenger that turns validation-layer and driver messages into a log
//! that tests can assert on.
//!
//! The log is its own `Arc`, apart from the instance, so that a test can still read it after
//! every Vulkan object is gone: leaks are reported at `vkDestroyDevice`/`vkDestroyInstance`, the
//! very last calls.

use std::ffi::c_void;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use ash::vk;

/// How many messages of each severity are kept; more are counted but dropped, so a runaway
/// validation error cannot eat the host's memory.
const KEEP: usize = 1000;

/// How serious a message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// The validation layer found an error: the program is wrong.
    Error,
    /// Likely a mistake or a performance problem.
    Warning,
}

/// One message from the validation layer or the driver.
#[derive(Clone, Debug)]
pub struct Message {
    /// Error or warning.
    pub severity: Severity,
    /// `general`, `validation` and/or `performance`.
    pub kind: String,
    /// The message id name, e.g. a VUID (empty when none).
    pub id_name: String,
    /// The message text.
    pub text: String,
}

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{:?} {}] {}: {}",
            self.severity, self.kind, self.id_name, self.text
        )
    }
}

#[derive(Default)]
struct Log {
    errors: Vec<Message>,
    warnings: Vec<Message>,
    dropped: usize,
}

/// The shared log of messages of severity ERROR and WARNING. Cheap to clone; outlives the
/// instance and devices it was recording.
#[derive(Clone, Default)]
pub struct ValidationLog {
    inner: Arc<Mutex<Log>>,
}

impl fmt::Debug for ValidationLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let log = self.lock();
        f.debug_struct("ValidationLog")
            .field("errors", &log.errors.len())
            .field("warnings", &log.warnings.len())
            .field("dropped", &log.dropped)
            .finish()
    }
}

impl ValidationLog {
    fn lock(&self) -> MutexGuard<'_, Log> {
        // A poisoned log is still a log: the panic that poisoned it is reported elsewhere.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Messages of severity ERROR so far.
    pub fn errors(&self) -> Vec<Message> {
        self.lock().errors.clone()
    }

    /// Messages of severity WARNING so far.
    pub fn warnings(&self) -> Vec<Message> {
        self.lock().warnings.clone()
    }

    /// Takes (and clears) the errors so far.
    pub fn take_errors(&self) -> Vec<Message> {
        std::mem::take(&mut self.lock().errors)
    }

    /// Takes (and clears) the warnings so far.
    pub fn take_warnings(&self) -> Vec<Message> {
        std::mem::take(&mut self.lock().warnings)
    }

    /// Messages beyond the kept 1000 per severity, counted but not stored.
    pub fn dropped(&self) -> usize {
        self.lock().dropped
    }

    /// No error recorded (warnings do not count).
    pub fn is_clean(&self) -> bool {
        let log = self.lock();
        log.errors.is_empty() && log.dropped == 0
    }

    /// The errors, one per line, for an assertion message.
    pub fn report(&self) -> String {
        let log = self.lock();
        let mut out = String::new();
        for m in &log.errors {
            out.push_str(&m.to_string());
            out.push('\n');
        }
        if log.dropped > 0 {
            out.push_str(&format!("(+{} messages dropped)\n", log.dropped));
        }
        out
    }

    #[cfg(test)]
    fn push(&self, m: Message) {
        push_into(&self.inner, m);
    }

    /// The pointer handed to Vulkan as the callback's user data. Valid while any clone of this
    /// log lives; the instance keeps one until after `vkDestroyInstance`.
    pub(crate) fn as_user_data(&self) -> *mut c_void {
        Arc::as_ptr(&self.inner) as *mut c_void
    }
}

/// The messenger create info recording ERROR and WARNING into `log`. Used both chained into
/// `VkInstanceCreateInfo` (to see `vkCreateInstance`/`vkDestroyInstance`) and for the messenger.
pub(crate) fn messenger_info(log: &ValidationLog) -> vk::DebugUtilsMessengerCreateInfoEXT<'static> {
    vk::DebugUtilsMessengerCreateInfoEXT::default()
        .message_severity(
            vk::DebugUtilsMessageSeverityFlagsEXT::ERROR
                | vk::DebugUtilsMessageSeverityFlagsEXT::WARNING,
        )
        .message_type(
            vk::DebugUtilsMessageTypeFlagsEXT::GENERAL
                | vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION
                | vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE,
        )
        .pfn_user_callback(Some(callback))
        .user_data(log.as_user_data())
}

fn kind_name(kind: vk::DebugUtilsMessageTypeFlagsEXT) -> String {
    let mut names = Vec::new();
    if kind.contains(vk::DebugUtilsMessageTypeFlagsEXT::GENERAL) {
        names.push("general");
    }
    if kind.contains(vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION) {
        names.push("validation");
    }
    if kind.contains(vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE) {
        names.push("performance");
    }
    names.join("+")
}

unsafe extern "system" fn callback(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    kind: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    user_data: *mut c_void,
) -> vk::Bool32 {
    // A panic must not unwind into the driver: catch it and drop the message.
    let _ = std::panic::catch_unwind(|| {
        if user_data.is_null() || data.is_null() {
            return;
        }
        let severity = if severity.contains(vk::DebugUtilsMessageSeverityFlagsEXT::ERROR) {
            Severity::Error
        } else if severity.contains(vk::DebugUtilsMessageSeverityFlagsEXT::WARNING) {
            Severity::Warning
        } else {
            return;
        };
        // SAFETY: Vulkan passes a valid callback-data struct for the duration of the call.
        let data = unsafe { &*data };
        // SAFETY: the pointers in it are null or NUL-terminated strings valid during the call.
        let id_name = unsafe { data.message_id_name_as_c_str() }
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        // SAFETY: as above.
        let text = unsafe { data.message_as_c_str() }
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        // SAFETY: `user_data` is `Arc::as_ptr` of a log kept alive by the instance until after
        // the messenger and the instance are destroyed (see `as_user_data`).
        let log = unsafe { &*(user_data as *const Mutex<Log>) };
        push_into(
            log,
            Message {
                severity,
                kind: kind_name(kind),
                id_name,
                text,
            },
        );
    });
    // VK_FALSE: never abort the call that triggered the message.
    vk::FALSE
}

/// Appends to the log, or counts the message as dropped past [`KEEP`].
fn push_into(log: &Mutex<Log>, m: Message) {
    let mut guard = log.lock().unwrap_or_else(|e| e.into_inner());
    let list = match m.severity {
        Severity::Error => &mut guard.errors,
        Severity::Warning => &mut guard.warnings,
    };
    if list.len() < KEEP {
        list.push(m);
    } else {
        guard.dropped += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_keeps_errors_and_warnings_apart() {
        let log = ValidationLog::default();
        log.push(Message {
            severity: Severity::Warning,
            kind: "performance".into(),
            id_name: "w".into(),
            text: "slow".into(),
        });
        assert!(log.is_clean());
        log.push(Message {
            severity: Severity::Error,
            kind: "validation".into(),
            id_name: "VUID-x".into(),
            text: "bad".into(),
        });
        assert!(!log.is_clean());
        assert!(log.report().contains("VUID-x"));
        assert_eq!(log.take_errors().len(), 1);
        assert!(log.is_clean());
        assert_eq!(log.warnings().len(), 1);
    }

    #[test]
    fn callback_records_through_user_data() {
        let log = ValidationLog::default();
        let text = c"hello";
        let id = c"VUID-test";
        let data = vk::DebugUtilsMessengerCallbackDataEXT::default()
            .message(text)
            .message_id_name(id);
        // SAFETY: the data and user data are valid for the call, as a driver would pass them.
        unsafe {
            callback(
                vk::DebugUtilsMessageSeverityFlagsEXT::ERROR,
                vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION,
                &data,
                log.as_user_data(),
            )
        };
        let errors = log.errors();
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].id_name, "VUID-test");
        assert_eq!(errors[0].text, "hello");
        assert_eq!(errors[0].kind, "validation");
    }
}
