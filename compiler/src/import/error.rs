//! Everything that can go wrong while importing a model directory.
//!
//! Every variant names the file it is about, and the field or tensor when there is one, so that
//! its `Display` alone tells the user what to fix.

use std::fmt;
use std::path::PathBuf;

/// An import failure. `Display` reads as `<file>: <what is wrong>`.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// A file or directory could not be read (absent, not a directory, no permission, ...).
    #[error("cannot read {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A JSON file (config.json, model.safetensors.index.json) does not parse.
    #[error("{}:{line}:{column}: invalid JSON: {message}", file.display())]
    BadJson {
        file: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },

    /// A field is missing or has the wrong type or range. `field` is a dotted path such as
    /// `rope_parameters.factor`.
    #[error("{}: field \"{field}\": {message}", file.display())]
    BadField {
        file: PathBuf,
        field: String,
        message: String,
    },

    /// Fields that are each well formed but do not fit together.
    #[error("{}: {message}", file.display())]
    Inconsistent { file: PathBuf, message: String },

    /// `architectures[0]` is not one of the model classes vkfuse implements.
    #[error(
        "{}: architecture \"{found}\" is not supported (supported: {})",
        file.display(),
        supported.join(", ")
    )]
    UnsupportedArchitecture {
        file: PathBuf,
        found: String,
        supported: &'static [&'static str],
    },

    /// A well-formed setting whose semantics vkfuse does not implement (a RoPE type, an
    /// activation, sliding-window attention, ...).
    #[error("{}: field \"{field}\": {message}", file.display())]
    Unsupported {
        file: PathBuf,
        field: String,
        message: String,
    },

    /// The directory has neither model.safetensors, an index, nor any *.safetensors file;
    /// `others` names the weight files of other formats it does have (PyTorch's, GGUF).
    #[error(
        "{}: no weights found (expected model.safetensors, model.safetensors.index.json or *.safetensors){}",
        dir.display(),
        other_formats(others)
    )]
    NoWeights { dir: PathBuf, others: Vec<String> },

    /// The index names a shard that is not in the directory.
    #[error("{}: shard \"{shard}\" is listed in weight_map but {} does not exist", index.display(), path.display())]
    MissingShard {
        index: PathBuf,
        shard: String,
        path: PathBuf,
    },

    /// A safetensors file's header is corrupt, or its size does not match it.
    #[error("{}: not a valid safetensors file: {message}", file.display())]
    BadSafetensors { file: PathBuf, message: String },

    /// A safetensors file ends before its header says it does (a cut-off download or copy).
    /// `at_least`: the header itself is cut, so only its own length is known.
    #[error(
        "{} is truncated: its header declares {}{expected} bytes, the file has {actual}",
        file.display(),
        if *at_least { "at least " } else { "" }
    )]
    TruncatedSafetensors {
        file: PathBuf,
        expected: u64,
        actual: u64,
        at_least: bool,
    },

    /// Two shards hold a tensor of the same name.
    #[error("tensor \"{tensor}\" is stored twice: in {} and in {}", first.display(), second.display())]
    DuplicateTensor {
        tensor: String,
        first: PathBuf,
        second: PathBuf,
    },

    /// A tensor the model needs is not in the checkpoint. `file` is the checkpoint's entry point
    /// (model.safetensors, the index, or the directory when the shards were found by globbing).
    #[error("{}: no tensor named \"{tensor}\"", file.display())]
    MissingTensor { file: PathBuf, tensor: String },

    /// A tensor has a different shape than the config implies.
    #[error(
        "{}: tensor \"{tensor}\" has shape {}, expected {}",
        file.display(),
        ShapeText(found),
        ShapeText(expected)
    )]
    WrongShape {
        file: PathBuf,
        tensor: String,
        found: Vec<usize>,
        expected: Vec<usize>,
    },

    /// A weight holds a NaN or an infinity: a damaged checkpoint, whose every token would be
    /// garbage.
    #[error(
        "{}: tensor \"{tensor}\" holds {value} at element {index}: a damaged checkpoint (every \
         logit computed from it would be NaN)",
        file.display()
    )]
    NonFinite {
        file: PathBuf,
        tensor: String,
        index: usize,
        value: String,
    },

    /// A requested tensor is stored in a dtype vkfuse does not read (only F32, F16 and BF16 are).
    #[error(
        "{}: tensor \"{tensor}\" has dtype {dtype}, which vkfuse cannot read (supported: F32, F16, BF16)",
        file.display()
    )]
    UnsupportedDtype {
        file: PathBuf,
        tensor: String,
        dtype: String,
    },
}

/// `[160, 64]`; `[]` for a scalar.
struct ShapeText<'a>(&'a [usize]);

impl fmt::Display for ShapeText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

impl ImportError {
    /// An [`ImportError::Io`] for `path`.
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> ImportError {
        let path = path.into();
        move |source| ImportError::Io { path, source }
    }

    /// A [`ImportError::BadJson`] for `file` from serde_json's error.
    pub(crate) fn json(file: impl Into<PathBuf>, e: &serde_json::Error) -> ImportError {
        // serde_json appends " at line L column C" to its Display; we report those separately.
        let text = e.to_string();
        let suffix = format!(" at line {} column {}", e.line(), e.column());
        let message = text.strip_suffix(&suffix).unwrap_or(&text).to_string();
        ImportError::BadJson {
            file: file.into(),
            line: e.line(),
            column: e.column(),
            message,
        }
    }
}

/// [`ImportError::NoWeights`]'s word on the weight files of other formats it found.
fn other_formats(others: &[String]) -> String {
    if others.is_empty() {
        return String::new();
    }
    format!(
        "; it has {}, which vkfuse does not read: save the model as safetensors (transformers: \
         model.save_pretrained(DIR, safe_serialization=True))",
        others.join(", ")
    )
}
