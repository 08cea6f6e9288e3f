//! `agl rollouts ls | show | export`: read rollouts straight from the store
//! (safe beside a running `agl serve`: WAL readers never block the writer).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Subcommand;

use agl_store::{DEFAULT_FILE, MAX_PAGE, MODEL_REQUEST, RolloutFilter, RolloutRecord, Store};
use agl_wire::record::ModelRequest;
use agl_wire::rollout::RolloutStatus;
use serde_json::{Value, json};

#[derive(Subcommand)]
pub enum RolloutsCommand {
    /// List rollouts in creation order.
    Ls {
        #[arg(long, default_value = DEFAULT_FILE)]
        db: PathBuf,
        /// Only this status (queued, running, succeeded, failed, cancelled).
        #[arg(long)]
        status: Option<String>,
        /// At most this many rows.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Print one rollout's record as JSON, with a line per model call of
    /// its current attempt: status, token counts, and the call it
    /// continued token-exactly (`continues`, an event seq).
    Show {
        id: String,
        #[arg(long, default_value = DEFAULT_FILE)]
        db: PathBuf,
    },
    /// Write rollouts as rollout JSONL (what `agl plugin test` reads).
    Export {
        /// Rollout ids; none = every rollout (of `--status`, if given).
        ids: Vec<String>,
        #[arg(long, default_value = DEFAULT_FILE)]
        db: PathBuf,
        #[arg(long)]
        status: Option<String>,
        /// Output file (default: stdout). No `-o`: that is the global override.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

pub fn run(cmd: RolloutsCommand) -> anyhow::Result<ExitCode> {
    let rt = super::runtime()?;
    rt.block_on(dispatch(cmd))?;
    Ok(ExitCode::SUCCESS)
}

async fn dispatch(cmd: RolloutsCommand) -> anyhow::Result<()> {
    match cmd {
        RolloutsCommand::Ls { db, status, limit } => {
            let store = open(&db)?;
            let mut out = std::io::stdout().lock();
            writeln!(
                out,
                "{:<36} {:<10} {:>7} {:<5} GROUP",
                "ID", "STATUS", "ATTEMPT", "MODE"
            )?;
            for r in all(&store, status.as_deref(), limit).await? {
                writeln!(
                    out,
                    "{:<36} {:<10} {:>7} {:<5} {}",
                    r.id,
                    r.status.as_str(),
                    r.attempt,
                    r.mode.as_str(),
                    r.group_id
                )?;
            }
        }
        RolloutsCommand::Show { id, db } => {
            let store = open(&db)?;
            let rec = store.get_rollout(&id).await?;
            let calls = calls_of(&store, &rec).await?;
            let mut shown = serde_json::to_value(&rec)?;
            shown["calls"] = Value::Array(calls);
            println!("{}", serde_json::to_string_pretty(&shown)?);
        }
        RolloutsCommand::Export {
            ids,
            db,
            status,
            out,
        } => {
            let store = open(&db)?;
            let ids = if ids.is_empty() {
                all(&store, status.as_deref(), usize::MAX)
                    .await?
                    .into_iter()
                    .map(|r| r.id)
                    .collect()
            } else {
                ids
            };
            let mut sink: Box<dyn Write> = match &out {
                Some(p) => Box::new(std::io::BufWriter::new(
                    std::fs::File::create(p)
                        .with_context(|| format!("creating {}", p.display()))?,
                )),
                None => Box::new(std::io::stdout().lock()),
            };
            for id in &ids {
                let rollout = store.export_rollout(id).await?;
                serde_json::to_writer(&mut sink, &rollout)?;
                sink.write_all(b"\n")?;
            }
            sink.flush()?;
            if let Some(p) = out {
                eprintln!("wrote {} rollouts to {}", ids.len(), p.display());
            }
        }
    }
    Ok(())
}

/// One summary per `model_request` of the rollout's current attempt.
async fn calls_of(store: &Store, rec: &RolloutRecord) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let page = store.list_events(&rec.id, after, MAX_PAGE).await?;
        let Some(last) = page.last() else {
            return Ok(out);
        };
        after = last.seq;
        for ev in page
            .iter()
            .filter(|e| e.attempt == rec.attempt && e.kind == MODEL_REQUEST)
        {
            let call: Option<ModelRequest> = serde_json::from_str(ev.payload.as_str()).ok();
            out.push(match call {
                Some(c) => json!({
                    "seq": ev.seq,
                    "status": c.status,
                    "prompt_tokens": c.prompt_ids.len(),
                    "response_tokens": c.response_ids.len(),
                    "finish_reason": c.finish_reason,
                    "continues": c.continues,
                    "choice": c.choice,
                    "superseded_by": ev.superseded_by,
                }),
                None => json!({"seq": ev.seq, "status": "unreadable"}),
            });
        }
    }
}

fn open(db: &std::path::Path) -> anyhow::Result<Store> {
    // Opening would create an empty store; a typo in --db should not.
    if !db.exists() {
        bail!("no store at {}", db.display());
    }
    Store::open(db).with_context(|| format!("opening {}", db.display()))
}

/// Up to `limit` rollouts, following cursors across pages.
async fn all(
    store: &Store,
    status: Option<&str>,
    limit: usize,
) -> anyhow::Result<Vec<RolloutRecord>> {
    let status = match status {
        Some(s) => Some(RolloutStatus::parse(s).with_context(|| format!("unknown status `{s}`"))?),
        None => None,
    };
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    while out.len() < limit {
        let page = store
            .list_rollouts(RolloutFilter::status(status), cursor.as_deref(), MAX_PAGE)
            .await?;
        out.extend(page.rollouts);
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    out.truncate(limit);
    Ok(out)
}
