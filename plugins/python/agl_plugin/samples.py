"""Building training samples: the host merges the rollout under way into
samples and classifies its breaks (`samples` in `wit/agl.wit`, by the rules
every plugin language shares); `merge_chains` and `classify_break` ask it.
Natively `agl_plugin.testing` stands in with the same rules (`agl plugin
rules`)."""

from . import host

try:
    from wit_world.imports import samples as _samples
except ImportError:  # a reward's world imports no `samples`
    _samples = None


def _imports():
    if _samples is None:
        raise host.HostError("the host merges for sample adapters only (world sample-adapter)")
    return _samples


def merge_chains(rollout, chain_by_agent=True, skip_empty_responses=True, summary_markers=(),
                 classify=None):
    """Merges the rollout's calls into as few samples as the ids allow: a call
    recorded as continuing call j (`continues`) joins the chain that ends with
    j; any other joins its agent's latest chain (one chain per `x-agl-agent`
    tag unless `chain_by_agent` is off) when its prompt starts with the chain
    so far, else starts a sample whose `break_before` says why. A history
    holding one of `summary_markers` (a harness's compaction text) that its
    chain's did not is a `summary` break. `classify(last_call, call)`, when
    given, names each break instead of the host. The choices of an `n` > 1
    request are parallel samples; the next call joins the one it extends."""
    samples = _imports()
    options = samples.MergeOptions(chain_by_agent=bool(chain_by_agent),
                                    skip_empty_responses=bool(skip_empty_responses),
                                    summary_markers=[str(m) for m in summary_markers])
    testing_rollout[0] = rollout
    merged = host._host(samples.merge, options)
    by_index = {int(c.index): c for c in rollout.calls}
    out = []
    for m in merged:
        sample = m.sample
        if classify is not None and m.after is not None and sample.break_before is not None:
            sample.break_before = classify(by_index[m.after], by_index[sample.source_calls[0]])
        out.append(sample)
    return out


def classify_break(prev, next_call):
    """Why `next_call`'s prompt does not start with `prev`'s prompt +
    response (`prev` being the last call of the chain), by the host's rules."""
    return host._host(_imports().classify_break, prev.index, next_call.index)


testing_rollout = [None]
"""The rollout `merge_chains` was last given: what `agl_plugin.testing`
merges natively (a component's host knows the rollout under way)."""
