"""agl's report sink: a run's step records as TensorBoard event files and a
Weights & Biases run, written with the projects' own packages.

`agl run` / `agl train` (host/agl/src/run/report/export.rs) embed this file,
write it to the run folder and feed it JSON lines on stdin:

    {"type": "start", "run_dir", "tensorboard": DIR | null,
     "wandb": {"project", "mode", "entity", "name"} | null,
     "resume_after": STEP | null, "config": {...}, "plugins": [...]}
    {"type": "step", "step", "wall_time", "scalars": {TAG: NUMBER}, "plugins": [...]}
    ...

then close stdin at the end of the run: the sink flushes, finishes the W&B
run and exits. It answers on stdout only with JSON lines {"level":
"info" | "warning", "message"} that agl logs; everything else (the
libraries' own output) goes to stderr, which agl sends to
`<run folder>/report_sink.log`. One export failing leaves the other going.
"""

import json
import os
import sys
import time
import uuid

# Only our messages go to the pipe agl reads: the libraries' prints (and
# their child processes') go to stderr.
_channel = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr


def say(level, message):
    _channel.write(json.dumps({"level": level, "message": message}) + "\n")
    _channel.flush()


def plugin_table(plugins):
    """The plugins as a Markdown table (TensorBoard's text dashboard)."""
    rows = ["| role | name | version | blake3 |", "|---|---|---|---|"]
    for p in plugins:
        rows.append(
            "| {} | {} | {} | `{}` |".format(
                p.get("role", ""), p.get("name", ""), p.get("version", ""),
                p.get("wasm_hash", ""),
            )
        )
    return "\n".join(rows)


class TensorBoard:
    """Event files in `dir`: a scalar per tag per step (`simple_value`,
    what TensorBoard's scalar dashboard and `EventAccumulator.Scalars`
    read), the config and the plugins as text."""

    def __init__(self, logdir, start):
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.compat.proto import tensor_pb2, tensor_shape_pb2, types_pb2
        from tensorboard.plugins.text import metadata as text_metadata
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.event_pb2 = event_pb2
        self.summary_pb2 = summary_pb2
        self.tensor_pb2 = tensor_pb2
        self.shape_pb2 = tensor_shape_pb2
        self.types_pb2 = types_pb2
        self.text_metadata = text_metadata
        self.logdir = logdir
        self.writer = EventFileWriter(logdir)
        self.plugins = None
        resume_after = start.get("resume_after")
        first = 0 if resume_after is None else resume_after + 1
        if resume_after is not None:
            # A restart: TensorBoard drops what earlier files hold from
            # this step on (steps a crashed run logged past its checkpoint).
            self.writer.add_event(
                event_pb2.Event(
                    wall_time=time.time(),
                    step=first,
                    session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START),
                )
            )
        config = json.dumps(start.get("config", {}), indent=2, sort_keys=True)
        self.text("config", "```json\n" + config + "\n```", first, time.time())
        self.set_plugins(start.get("plugins", []), first, time.time())
        self.writer.flush()

    def text(self, tag, text, step, wall_time):
        tensor = self.tensor_pb2.TensorProto(
            dtype=self.types_pb2.DT_STRING,
            string_val=[text.encode("utf-8")],
            tensor_shape=self.shape_pb2.TensorShapeProto(),
        )
        value = self.summary_pb2.Summary.Value(
            tag=tag,
            metadata=self.text_metadata.create_summary_metadata(display_name=tag, description=""),
            tensor=tensor,
        )
        self.writer.add_event(
            self.event_pb2.Event(
                wall_time=wall_time, step=step, summary=self.summary_pb2.Summary(value=[value])
            )
        )

    def set_plugins(self, plugins, step, wall_time):
        if plugins and plugins != self.plugins:
            self.plugins = plugins
            self.text("plugins", plugin_table(plugins), step, wall_time)

    def step(self, msg):
        values = [
            self.summary_pb2.Summary.Value(tag=tag, simple_value=float(v))
            for tag, v in sorted(msg["scalars"].items())
        ]
        self.writer.add_event(
            self.event_pb2.Event(
                wall_time=msg["wall_time"],
                step=msg["step"],
                summary=self.summary_pb2.Summary(value=values),
            )
        )
        self.set_plugins(msg.get("plugins", []), msg["step"], msg["wall_time"])
        # Steps are seconds apart: a live TensorBoard sees each at once.
        self.writer.flush()

    def close(self):
        self.writer.close()


class Wandb:
    """A W&B run: the config as the run config (plugins included), a
    history row per step (`step` = the update), the plugins in the
    summary. Offline, it lives in `<run_dir>/wandb/offline-run-*` until
    `wandb sync`; a resumed agl run continues the same W&B run id."""

    def __init__(self, cfg, start):
        import wandb

        run_dir = start["run_dir"]
        id_file = os.path.join(run_dir, "wandb", "agl-run-id")
        os.makedirs(os.path.dirname(id_file), exist_ok=True)
        run_id = None
        if start.get("resume_after") is not None and os.path.exists(id_file):
            with open(id_file) as f:
                run_id = f.read().strip() or None
        if run_id is None:
            run_id = uuid.uuid4().hex[:12]
            with open(id_file, "w") as f:
                f.write(run_id + "\n")
        config = dict(start.get("config", {}))
        config["plugins"] = start.get("plugins", [])
        self.run = wandb.init(
            project=cfg["project"],
            entity=cfg.get("entity"),
            name=cfg.get("name"),
            mode=cfg.get("mode", "offline"),
            dir=run_dir,
            id=run_id,
            resume="allow",
            config=config,
            settings=wandb.Settings(console="off", x_disable_stats=True, save_code=False),
        )
        self.plugins = None
        self.set_plugins(start.get("plugins", []))
        where = getattr(self.run.settings, "sync_dir", None) or run_dir
        if cfg.get("mode", "offline") == "offline":
            say("info", "wandb: offline run in {} (upload: wandb sync {})".format(where, where))
        else:
            say("info", "wandb: {}".format(self.run.url))

    def set_plugins(self, plugins):
        if plugins and plugins != self.plugins:
            self.plugins = plugins
            self.run.summary["plugins"] = plugins

    def step(self, msg):
        self.run.log(dict(msg["scalars"]), step=msg["step"])
        self.set_plugins(msg.get("plugins", []))

    def close(self):
        self.run.finish()


def main():
    first = sys.stdin.readline()
    if not first:
        return 0
    start = json.loads(first)
    sinks = []
    if start.get("tensorboard"):
        try:
            sinks.append(("tensorboard", TensorBoard(start["tensorboard"], start)))
            say("info", "tensorboard: {}".format(start["tensorboard"]))
        except Exception as e:  # noqa: BLE001 -- reported, the other export goes on
            say("warning", "tensorboard export off: {}: {}".format(type(e).__name__, e))
    if start.get("wandb"):
        try:
            sinks.append(("wandb", Wandb(start["wandb"], start)))
        except Exception as e:  # noqa: BLE001
            say("warning", "wandb export off: {}: {}".format(type(e).__name__, e))
    if not sinks:
        return 1
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        for entry in list(sinks):
            name, sink = entry
            try:
                sink.step(msg)
            except Exception as e:  # noqa: BLE001
                say("warning", "{} export stopped at step {}: {}: {}".format(
                    name, msg.get("step"), type(e).__name__, e))
                sinks.remove(entry)
    status = 0
    for name, sink in sinks:
        try:
            sink.close()
        except Exception as e:  # noqa: BLE001
            say("warning", "{} export did not close: {}: {}".format(name, type(e).__name__, e))
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
