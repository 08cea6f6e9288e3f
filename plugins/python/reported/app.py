"""Built-in reward `reported`, in Python: the harness's own reward, the
last `reward` event it posted (the Rust `plugins/reported`, same results)."""

from agl_plugin import last_reward, reward_world

WitWorld = reward_world(
    "reported-py",
    "0.1.0",
    "the harness's own reward: its last reward event (Python)",
    last_reward,
)
