//! The run's inputs: a JSONL file split into train and val rows, and a
//! resumable cursor that walks the train rows in a seeded order per epoch.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Row {
        path: String,
        line: usize,
        message: String,
    },
    #[error("{0} has no train rows")]
    NoTrain(String),
}

pub struct Dataset {
    pub train: Vec<Value>,
    pub val: Vec<Value>,
}

impl Dataset {
    /// Reads `path` ([`read_rows`]); `"split": "val"` marks a validation
    /// row (anything else, or none, is train).
    pub fn load(path: &Path) -> Result<Dataset, DataError> {
        let (mut train, mut val) = (Vec::new(), Vec::new());
        for row in read_rows(path)? {
            match row.get("split").and_then(Value::as_str) {
                Some("val") => val.push(row),
                _ => train.push(row),
            }
        }
        if train.is_empty() {
            return Err(DataError::NoTrain(path.display().to_string()));
        }
        Ok(Dataset { train, val })
    }
}

/// Every row of the data file `path`, in order: JSONL (each line a JSON
/// object, blank lines skipped) or, for a `.parquet` file (a Hugging Face
/// dataset's, e.g. SWE-bench), each row as a JSON object of its columns.
pub fn read_rows(path: &Path) -> Result<Vec<Value>, DataError> {
    if path.extension().is_some_and(|e| e == "parquet") {
        return read_parquet(path);
    }
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| DataError::Read {
        path: shown.clone(),
        source,
    })?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let row: Value = serde_json::from_str(line).map_err(|e| DataError::Row {
            path: shown.clone(),
            line: i + 1,
            message: e.to_string(),
        })?;
        if !row.is_object() {
            return Err(DataError::Row {
                path: shown.clone(),
                line: i + 1,
                message: "expected a JSON object".into(),
            });
        }
        rows.push(row);
    }
    Ok(rows)
}

fn read_parquet(path: &Path) -> Result<Vec<Value>, DataError> {
    use parquet::file::reader::SerializedFileReader;
    let shown = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| DataError::Read {
        path: shown.clone(),
        source,
    })?;
    let row_err = |line: usize, e: parquet::errors::ParquetError| DataError::Row {
        path: shown.clone(),
        line,
        message: e.to_string(),
    };
    let reader = SerializedFileReader::new(file).map_err(|e| row_err(0, e))?;
    reader
        .into_iter()
        .enumerate()
        .map(|(i, row)| {
            row.map(|r| r.to_json_value())
                .map_err(|e| row_err(i + 1, e))
        })
        .collect()
}

/// Where the run is in the train rows; saved in checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Cursor {
    pub epoch: u64,
    pub index: usize,
}

impl Cursor {
    /// The next train row (its position in `rows`), advancing the cursor;
    /// each epoch is a fresh permutation seeded by `(seed, epoch)`.
    pub fn next(&mut self, rows: usize, seed: u64) -> usize {
        if self.index >= rows {
            self.epoch += 1;
            self.index = 0;
        }
        let order = permutation(rows, seed ^ self.epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let row = order[self.index];
        self.index += 1;
        row
    }
}

/// Fisher-Yates with splitmix64: deterministic across platforms and runs.
fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_visits_every_row_once_per_epoch_and_resumes_identically() {
        let mut c = Cursor::default();
        let mut first: Vec<usize> = (0..10).map(|_| c.next(10, 7)).collect();
        let saved = c;
        let mut second: Vec<usize> = (0..10).map(|_| c.next(10, 7)).collect();
        let mut resumed = saved;
        let again: Vec<usize> = (0..10).map(|_| resumed.next(10, 7)).collect();
        assert_eq!(second, again);
        assert_ne!(first, second, "each epoch is reshuffled");
        first.sort_unstable();
        second.sort_unstable();
        assert_eq!(first, (0..10).collect::<Vec<_>>());
        assert_eq!(second, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn load_splits_rows_and_rejects_bad_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d.jsonl");
        std::fs::write(&p, "{\"q\":1}\n\n{\"q\":2,\"split\":\"val\"}\n").unwrap();
        let d = Dataset::load(&p).unwrap();
        assert_eq!((d.train.len(), d.val.len()), (1, 1));
        std::fs::write(&p, "{\"q\":1}\nnope\n").unwrap();
        let err = Dataset::load(&p).err().unwrap().to_string();
        assert!(err.contains(":2:"), "{err}");
    }
}
