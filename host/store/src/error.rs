//! Everything a store call can fail with.

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("cannot open store {path}: {source}")]
    Open {
        path: String,
        source: rusqlite::Error,
    },
    #[error("cannot create store {path} owner-only: {source}")]
    Private {
        path: String,
        source: std::io::Error,
    },
    #[error("store {path}: cannot use WAL (journal_mode is {mode})")]
    NoWal { path: String, mode: String },
    #[error(
        "store schema version {found} is newer than this agl supports ({supported}); upgrade agl"
    )]
    SchemaTooNew { found: i64, supported: i64 },
    #[error("migrating to schema {version} would leave {violations} foreign key(s) broken")]
    MigrationBroke { version: i64, violations: i64 },
    #[error("rollout `{0}` not found")]
    RolloutNotFound(String),
    #[error("event {0} not found")]
    EventNotFound(u64),
    #[error("engine `{0}` not found")]
    EngineNotFound(String),
    #[error("rollout `{id}`: illegal transition {from} -> {to}")]
    IllegalTransition {
        id: String,
        from: &'static str,
        to: &'static str,
    },
    #[error("rollout `{id}`: attempt {given} is stale (current attempt is {current})")]
    StaleAttempt {
        id: String,
        given: u32,
        current: u32,
    },
    #[error("cannot supersede event {old} with {new}: {why}")]
    Supersede { old: u64, new: u64, why: String },
    #[error("weight version {0} already recorded")]
    WeightVersionExists(u64),
    #[error("invalid status change: {0}")]
    BadPatch(String),
    #[error("invalid cursor `{0}`")]
    BadCursor(String),
    #[error("value out of range: {0}")]
    OutOfRange(String),
    #[error("corrupt row: {0}")]
    BadRow(String),
    #[error("batch commit failed: {0}")]
    Commit(String),
    #[error("invalid rollout id: {0}")]
    BadId(String),
    #[error("store writer has stopped")]
    Closed,
    #[error("event log {path}: {source}")]
    Log {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "another process writes this store (it holds {0}); events are appended only through it"
    )]
    LogHeld(String),
}

/// How the HTTP API answers each store error: missing = 404, a refused
/// change = 409, bad input = 400, the rest = 500 (logged).
impl From<StoreError> for agl_wire::ApiError {
    fn from(e: StoreError) -> Self {
        use StoreError::*;
        use agl_wire::ApiError;
        match &e {
            RolloutNotFound(_) | EventNotFound(_) | EngineNotFound(_) => {
                ApiError::not_found(e.to_string())
            }
            IllegalTransition { .. }
            | StaleAttempt { .. }
            | Supersede { .. }
            | WeightVersionExists(_)
            | LogHeld(_) => ApiError::conflict(e.to_string()),
            BadPatch(_) | BadCursor(_) | OutOfRange(_) | BadId(_) => {
                ApiError::bad_request(e.to_string())
            }
            _ => {
                tracing::error!(error = %e, "store failure");
                ApiError::internal(e.to_string())
            }
        }
    }
}
