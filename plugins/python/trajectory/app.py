"""Built-in adapter `trajectory`, in Python: the SDK's `merge_chains` (the
Rust `plugins/trajectory`'s samples on the same rollouts). Config
(`[plugin.trajectory-py]`): `chain_by_agent` (default true)."""

from agl_plugin import adapter, config, merge_chains


@adapter
def build_samples(rollout):
    cfg = config({"chain_by_agent": True})
    return merge_chains(rollout, chain_by_agent=bool(cfg["chain_by_agent"]))
