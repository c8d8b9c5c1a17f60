//! The `.npy` format (version 1.0, little-endian f32, C order): how logits travel between
//! vkfuse and transformers' fixtures.

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    #[error("cannot read {path}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot write {path}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not a float32 .npy file this reader understands: {message}")]
    Format { path: String, message: String },
}

/// A 2-d f32 array, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Array2 {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

impl Array2 {
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

pub fn to_bytes(a: &Array2) -> Vec<u8> {
    let mut header = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}",
        a.rows, a.cols
    );
    // Magic (6) + version (2) + header length (2) + header + '\n' is a multiple of 64.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in &a.data {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// Writes `a` to `path` (through a device or a link, as any write does); a regular file that a
/// failed write left short is removed rather than left with a header that claims every row.
pub fn write(path: &Path, a: &Array2) -> Result<(), NpyError> {
    std::fs::write(path, to_bytes(a)).map_err(|source| {
        if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file()) {
            let _ = std::fs::remove_file(path);
        }
        NpyError::Write {
            path: path.display().to_string(),
            source,
        }
    })
}

pub fn from_bytes(bytes: &[u8], path: &str) -> Result<Array2, NpyError> {
    let bad = |m: &str| NpyError::Format {
        path: path.to_string(),
        message: m.to_string(),
    };
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(bad("missing the \\x93NUMPY magic"));
    }
    let (len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        _ => return Err(bad("unsupported version")),
    };
    let header = bytes
        .get(start..start + len)
        .ok_or_else(|| bad("truncated header"))?;
    let header = std::str::from_utf8(header).map_err(|_| bad("header is not text"))?;
    if !header.contains("'descr': '<f4'") || header.contains("'fortran_order': True") {
        return Err(bad("only little-endian float32 in C order is supported"));
    }
    let shape = header
        .split("'shape': (")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| bad("no shape"))?;
    let dims: Vec<usize> = shape
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| bad("bad shape")))
        .collect::<Result<_, _>>()?;
    let (rows, cols) = match dims[..] {
        [r, c] => (r, c),
        [c] => (1, c),
        _ => return Err(bad("expected a 1-d or 2-d array")),
    };
    let body = &bytes[start + len..];
    if body.len() != rows * cols * 4 {
        return Err(bad(&format!(
            "expected {} bytes of data, found {}",
            rows * cols * 4,
            body.len()
        )));
    }
    let data = body
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok(Array2 { rows, cols, data })
}

pub fn read(path: &Path) -> Result<Array2, NpyError> {
    let bytes = std::fs::read(path).map_err(|source| NpyError::Read {
        path: path.display().to_string(),
        source,
    })?;
    from_bytes(&bytes, &path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_truncation() {
        let a = Array2 {
            rows: 3,
            cols: 5,
            data: (0..15).map(|i| i as f32 * 0.5 - 2.0).collect(),
        };
        let bytes = to_bytes(&a);
        assert_eq!((bytes.len() - 15 * 4) % 64, 0);
        assert_eq!(from_bytes(&bytes, "x").unwrap(), a);
        for cut in [0, 5, 9, 40, bytes.len() - 1] {
            assert!(from_bytes(&bytes[..cut], "x").is_err(), "cut at {cut}");
        }
    }
}
