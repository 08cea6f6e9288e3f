"""Built-in reward `reported`, in Python: the harness's own reward, the
last `reward` event it posted (the Rust `plugins/reported`, same results)."""

from agl_plugin import last_reward, reward


@reward
def score(rollout):
    return last_reward(rollout)
