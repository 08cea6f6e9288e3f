//! The durable store: one SQLite file (`agl.db` by default) holding rollouts,
//! their attempts, append-only events, engines and weight versions.
//!
//! Durability: WAL, and every write is acknowledged only after the
//! transaction holding it has committed, so `kill -9` never loses an
//! acknowledged write; [`Durability::Power`] adds an fsync per commit for
//! power loss (`[store] durability`). An event append (a proxied call's
//! record) is the exception without `power`: it is acknowledged once it is
//! copied into the event log beside the database (a shared memory map of
//! it, whose pages survive `kill -9` as a WAL commit does) and ingested into SQLite by the
//! writer thread right after, ahead of any later write; a read waits for
//! what was logged before it began (`eventlog.rs`). Writes go through one queue, and
//! whoever holds the write connection commits whatever has queued up as one
//! transaction (group commit, see `writer.rs`), so a commit's cost is shared
//! under load: the writer thread, or a write that came alone and found the
//! connection free, on its caller's thread; the log is copied
//! into the database by a background checkpointer, never inside a commit
//! (`checkpoint.rs`). Reads use separate
//! read-only connections and never wait for the writer; what the proxy reads
//! on every call is memoised (`cache.rs`).
//!
//! Rollout states: queued -> running -> succeeded | failed | cancelled, and
//! queued -> cancelled (see `state.rs`). `retry` re-queues a failed rollout as
//! attempt + 1. Attempts count from 1.
//!
//! `model_request` event payload (what the gateway writes, what `export_rollout`
//! reads): [`agl_wire::record::ModelRequest`]. Export numbers the current
//! attempt's non-superseded `model_request` events 0, 1, ... in sequence
//! order; all other events become [`agl_wire::rollout::Event`]s.

mod cache;
mod checkpoint;
mod config;
mod error;
mod eventlog;
mod export;
mod reads;
mod rows;
mod schema;
pub mod state;
mod types;
mod writer;
mod writes;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::Connection;

pub use agl_wire::api::{
    Engine, EngineApi, EventRecord, NewRollout, RegisterEngine, Render, StatusPatch,
};
pub use agl_wire::record::MODEL_REQUEST;
pub use agl_wire::rollout::Mode;
pub use config::StoreConfig;
pub use error::StoreError;
pub use reads::MAX_PAGE;
pub use schema::Durability;
pub use schema::{PAGE_SIZE, SCHEMA_VERSION};
pub use types::{RolloutFilter, RolloutGate, RolloutPage, RolloutRecord, WeightVersion};

use agl_wire::rollout::{JsonText, Rollout};
use agl_wire::urls;

/// The default file name of the store.
pub const DEFAULT_FILE: &str = "agl.db";

/// Idle read connections kept for reuse.
const READ_POOL: usize = 8;

/// A handle to the store; clones share the writer and the read pool.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

/// [`StoreConfig::max_system_retries`]'s default.
pub const DEFAULT_SYSTEM_RETRIES: u32 = 2;

struct Inner {
    path: PathBuf,
    /// See [`StoreConfig::max_system_retries`].
    system_retries: u32,
    /// Bumped after every committed change of a rollout's state (created,
    /// patched, retried, cancelled): what [`Store::changes`] watches.
    changes: tokio::sync::watch::Sender<u64>,
    writer: writer::Writer,
    appends: Appends,
    readers: Mutex<Vec<Connection>>,
    gates: cache::Memo<String, RolloutGate>,
    engines: cache::Memo<(), Vec<Engine>>,
    weights: cache::Memo<(), Option<WeightVersion>>,
}

/// How this process appends events.
enum Appends {
    /// Through the event log (`durability = "process"`).
    Logged,
    /// In SQLite commits (`durability = "power"`); the log is held for its
    /// lock alone.
    Committed { _lock: eventlog::EventLog },
    /// Not at all: another process holds the event log (its path).
    Refused(String),
}

impl Store {
    /// Opens (creating if needed) and migrates the store at `path`, with
    /// the default durability.
    pub fn open(path: impl AsRef<Path>) -> Result<Store, StoreError> {
        Store::open_with(path, Durability::default())
    }

    /// Opens the store at `path` with `durability` and the default retry
    /// budget.
    pub fn open_with(path: impl AsRef<Path>, durability: Durability) -> Result<Store, StoreError> {
        let config = StoreConfig {
            durability,
            ..StoreConfig::default()
        };
        Store::open_config(path, &config)
    }

    /// Opens the store at `path` as `[store]` says. One process writes a
    /// store file at a time (the read memos rely on it).
    pub fn open_config(path: impl AsRef<Path>, config: &StoreConfig) -> Result<Store, StoreError> {
        let durability = config.durability;
        let path = path.as_ref().to_path_buf();
        let conn = schema::open_writer(&path, durability)?;
        let (log, appends) = match eventlog::open(&path)? {
            eventlog::Opened::Held(log) => (None, Appends::Refused(log.display().to_string())),
            eventlog::Opened::Owned(mut file, left) => {
                replay(&conn, left)?;
                file.clear()?;
                match durability {
                    Durability::Process => {
                        let next_seq = writes::next_seq(&conn)?;
                        (Some(writer::Log { file, next_seq }), Appends::Logged)
                    }
                    Durability::Power => (None, Appends::Committed { _lock: file }),
                }
            }
        };
        let checkpoints = checkpoint::spawn(&path)?;
        // The checkpointer does what SQLite would do inside a commit, until
        // the log passes the limit (see `StoreConfig::wal_limit_mib`).
        let page_size: i64 = conn.pragma_query_value(None, "page_size", |r| r.get(0))?;
        let limit_pages = i64::from(config.wal_limit_mib.get()) * 1024 * 1024 / page_size.max(1);
        conn.pragma_update(None, "wal_autocheckpoint", limit_pages)?;
        let writer = writer::spawn(conn, durability, checkpoints, log)
            .map_err(|e| StoreError::Commit(e.to_string()))?;
        Ok(Store {
            inner: Arc::new(Inner {
                path,
                system_retries: config.max_system_retries,
                changes: tokio::sync::watch::Sender::new(0),
                writer,
                appends,
                readers: Mutex::new(Vec::new()),
                gates: Default::default(),
                engines: Default::default(),
                weights: Default::default(),
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// A counter bumped after every committed change of a rollout's state:
    /// who waits for rollouts to end is woken by it instead of polling.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    fn changed(&self) {
        self.inner.changes.send_modify(|n| *n += 1);
    }

    /// Commits a write (see [`writer::Writer::submit`]); resolves once it
    /// is committed (or has failed).
    async fn write<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (job, rx) = writer::job(work);
        self.inner.writer.submit(job)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// Runs a read inside one read transaction (a consistent snapshot),
    /// once every event logged before it is ingested.
    async fn read<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        self.inner.writer.caught_up().await;
        let inner = self.inner.clone();
        let task = tokio::task::spawn_blocking(move || {
            let pooled = inner.readers.lock().ok().and_then(|mut p| p.pop());
            let mut conn = match pooled {
                Some(c) => c,
                None => schema::open_reader(&inner.path)?,
            };
            let out = {
                let tx = conn.transaction()?;
                let out = work(&tx);
                tx.finish()?;
                out
            };
            if let Ok(mut pool) = inner.readers.lock()
                && pool.len() < READ_POOL
            {
                pool.push(conn);
            }
            out
        });
        task.await.map_err(|e| StoreError::Commit(e.to_string()))?
    }

    pub async fn create_rollouts(
        &self,
        batch: Vec<NewRollout>,
    ) -> Result<Vec<RolloutRecord>, StoreError> {
        // Checked before the batch reaches the writer: a bad id refuses the
        // whole batch and nothing of it is written.
        for id in batch.iter().filter_map(|r| r.id.as_deref()) {
            urls::check_rollout_id(id).map_err(StoreError::BadId)?;
        }
        let out = self.write(move |c| writes::create_rollouts(c, batch)).await;
        self.changed();
        out
    }

    pub async fn get_rollout(&self, id: &str) -> Result<RolloutRecord, StoreError> {
        let id = id.to_string();
        self.read(move |c| rows::get_rollout(c, &id)).await
    }

    /// A rollout's status and current attempt: what the proxy checks on
    /// every call, memoised.
    pub async fn rollout_gate(&self, id: &str) -> Result<RolloutGate, StoreError> {
        let generation = match self.inner.gates.get(id) {
            Ok(gate) => return Ok(gate),
            Err(g) => g,
        };
        let rec = self.get_rollout(id).await?;
        let gate = RolloutGate {
            status: rec.status,
            attempt: rec.attempt,
            mode: rec.mode,
        };
        self.inner.gates.fill(generation, rec.id, gate);
        Ok(gate)
    }

    /// One page of rollouts in creation order, optionally of one status.
    pub async fn list_rollouts(
        &self,
        filter: RolloutFilter,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<RolloutPage, StoreError> {
        let cursor = cursor.map(str::to_string);
        self.read(move |c| reads::list_rollouts(c, &filter, cursor.as_deref(), limit))
            .await
    }

    /// The controller's patch. Naming the attempt keeps a stale controller
    /// from moving a newer attempt.
    /// A `failed` patch must say whose failure it is (`patch.failure`).
    pub async fn set_status(
        &self,
        id: &str,
        patch: &StatusPatch,
    ) -> Result<RolloutRecord, StoreError> {
        patch.check().map_err(StoreError::BadPatch)?;
        let (id, patch) = (id.to_string(), patch.clone());
        let key = id.clone();
        let budget = self.inner.system_retries;
        let out = self
            .write(move |c| writes::set_status(c, &id, &patch, budget))
            .await;
        self.inner.gates.invalidate(Some(&key));
        self.changed();
        out
    }

    /// Re-queues a failed rollout as a new attempt.
    pub async fn retry(&self, id: &str) -> Result<RolloutRecord, StoreError> {
        let key = id.to_string();
        let id = key.clone();
        let out = self.write(move |c| writes::retry(c, &id)).await;
        self.inner.gates.invalidate(Some(&key));
        self.changed();
        out
    }

    pub async fn cancel(&self, id: &str) -> Result<RolloutRecord, StoreError> {
        let key = id.to_string();
        let id = key.clone();
        let out = self.write(move |c| writes::cancel(c, &id)).await;
        self.inner.gates.invalidate(Some(&key));
        self.changed();
        out
    }

    /// Appends an event; returns its global sequence number once durable.
    pub async fn append_event(
        &self,
        rollout_id: &str,
        attempt: u32,
        kind: &str,
        payload: JsonText,
    ) -> Result<u64, StoreError> {
        let seqs = self
            .append((rollout_id, attempt, kind), vec![payload], |_| Vec::new())
            .await?;
        seqs.first()
            .copied()
            .ok_or_else(|| StoreError::Commit("an appended event got no seq".into()))
    }

    /// Appends `model_request` events at once (the choices of one request:
    /// consecutive seqs, all or none). `retry_of(seqs)` runs once they have
    /// their seqs; each `(old, new)` it returns (a client retry) is
    /// superseded with them, so a crash cannot leave both exported. A
    /// supersede that fails is logged: the calls themselves still stand.
    pub async fn append_calls(
        &self,
        rollout_id: &str,
        attempt: u32,
        payloads: Vec<JsonText>,
        retry_of: impl FnOnce(&[u64]) -> Vec<(u64, u64)> + Send + 'static,
    ) -> Result<Vec<u64>, StoreError> {
        self.append((rollout_id, attempt, MODEL_REQUEST), payloads, retry_of)
            .await
    }

    /// Appends events to the log, or commits them (see [`Appends`]).
    async fn append(
        &self,
        (rollout_id, attempt, kind): (&str, u32, &str),
        payloads: Vec<JsonText>,
        retry_of: impl FnOnce(&[u64]) -> Vec<(u64, u64)> + Send + 'static,
    ) -> Result<Vec<u64>, StoreError> {
        match &self.inner.appends {
            Appends::Refused(log) => Err(StoreError::LogHeld(log.clone())),
            Appends::Logged => {
                // What the attempt's foreign key checks at ingestion, checked
                // before the caller is answered.
                let gate = self.rollout_gate(rollout_id).await?;
                if attempt == 0 || attempt > gate.attempt {
                    return Err(StoreError::StaleAttempt {
                        id: rollout_id.to_string(),
                        given: attempt,
                        current: gate.attempt,
                    });
                }
                let key = (rollout_id.to_string(), attempt, kind.to_string());
                self.inner.writer.log_append(key, payloads, retry_of)
            }
            Appends::Committed { .. } => {
                let (id, kind) = (rollout_id.to_string(), kind.to_string());
                self.write(move |c| {
                    let seqs = payloads
                        .iter()
                        .map(|p| writes::append_event(c, &id, attempt, &kind, p))
                        .collect::<Result<Vec<u64>, _>>()?;
                    writes::supersede_all(c, &retry_of(&seqs));
                    Ok(seqs)
                })
                .await
            }
        }
    }

    /// Events of a rollout with `seq > after_seq`, in sequence order.
    pub async fn list_events(
        &self,
        rollout_id: &str,
        after_seq: u64,
        limit: u32,
    ) -> Result<Vec<EventRecord>, StoreError> {
        let id = rollout_id.to_string();
        self.read(move |c| reads::list_events(c, &id, after_seq, limit))
            .await
    }

    /// Registers (or replaces) engine `e.name`, its `base_url` stored as
    /// given.
    pub async fn register_engine(&self, e: &RegisterEngine) -> Result<Engine, StoreError> {
        let e = e.clone();
        let out = self.write(move |c| writes::register_engine(c, &e)).await;
        self.inner.engines.invalidate(None);
        out
    }

    /// Registered engines (memoised; read by the proxy on every call).
    pub async fn list_engines(&self) -> Result<Vec<Engine>, StoreError> {
        let generation = match self.inner.engines.get(&()) {
            Ok(engines) => return Ok(engines),
            Err(g) => g,
        };
        let engines = self.read(reads::list_engines).await?;
        self.inner.engines.fill(generation, (), engines.clone());
        Ok(engines)
    }

    pub async fn remove_engine(&self, name: &str) -> Result<(), StoreError> {
        let name = name.to_string();
        let out = self.write(move |c| writes::remove_engine(c, &name)).await;
        self.inner.engines.invalidate(None);
        out
    }

    pub async fn record_weight_version(
        &self,
        version: u64,
        meta: JsonText,
    ) -> Result<WeightVersion, StoreError> {
        let out = self
            .write(move |c| writes::record_weight_version(c, version, &meta))
            .await;
        self.inner.weights.invalidate(None);
        out
    }

    /// The newest weight version (memoised; read by the proxy on every call).
    pub async fn latest_weight_version(&self) -> Result<Option<WeightVersion>, StoreError> {
        let generation = match self.inner.weights.get(&()) {
            Ok(latest) => return Ok(latest),
            Err(g) => g,
        };
        let latest = self.read(reads::latest_weight_version).await?;
        self.inner.weights.fill(generation, (), latest.clone());
        Ok(latest)
    }

    /// The rollout's current attempt in the rollout JSONL format.
    pub async fn export_rollout(&self, id: &str) -> Result<Rollout, StoreError> {
        let id = id.to_string();
        self.read(move |c| export::export_rollout(c, &id)).await
    }
}

/// Ingests what a crash left in the event log, in one transaction (the
/// writer's batch, each entry in its savepoint), before the store serves;
/// an entry that cannot be ingested is logged and left out (its rollout
/// attempt is gone from the database).
fn replay(conn: &Connection, entries: Vec<eventlog::Entry>) -> Result<(), StoreError> {
    if entries.is_empty() {
        return Ok(());
    }
    tracing::info!(
        entries = entries.len(),
        "ingesting the event log left by the last run"
    );
    // Nobody awaits these jobs: each logs its own failure.
    let mut batch: Vec<_> = entries
        .into_iter()
        .map(|entry| {
            let (job, _answer) = writer::job(move |c| {
                let out = writes::ingest(c, &entry);
                if let Err(e) = &out {
                    tracing::error!(rollout = %entry.rollout_id, error = %e, "dropping a logged event that cannot be ingested");
                }
                out
            });
            job
        })
        .collect();
    writer::run_batch(conn, &mut batch)?;
    Ok(())
}
