"""The SDK on 0.5 prompts: hand-made rollouts are linked by the host's rule
and their data served on demand, and the merge that continues chains by a
linked prompt's tail builds the samples the whole prompts give."""

import dataclasses
import unittest
from pathlib import Path

from agl_plugin import (
    HostError, Prompt, SampleBuilder, merge_chains, prompt_ids, prompt_len, request_json,
    response_json, testing,
)
from agl_plugin.testing import call, chat, rollout
from wit_world.imports import rollout_data

FIXTURES = Path(__file__).resolve().parents[3] / "examples/fixtures"


def whole_prompts(r):
    """`r` with every prompt handed over whole, linked to no call (the
    record before 0.5): the merge compares every prompt in full."""
    calls = [dataclasses.replace(c, prompt=Prompt(extends=None, shared=0, tail=list(prompt_ids(c))))
             for c in r.calls]
    return dataclasses.replace(r, calls=calls)


def hand_made():
    """Rollouts that take each path of the merge: a clean chain, a changed
    prompt, interleaved agents, a gateway link, choices, an empty response."""
    sub = {"x-agl-agent": "sub"}
    ask = lambda text: {"messages": [{"role": "user", "content": text}]}  # noqa: E731
    yield rollout([call(0, [1, 2], [10, 11]), call(1, [1, 2, 10, 11, 20], [30]),
                   call(2, [1, 2, 10, 11, 20, 30, 21], [40])])
    yield rollout([call(0, [1, 2], [10], request=ask("a"), response=chat("b")),
                   call(1, [1, 2, 99], [11], request=ask("c"))])
    yield rollout([call(0, [1], [2]), call(1, [7], [8], tags=sub), call(2, [1, 2, 3], [4]),
                   call(3, [7, 8, 9], [10], tags=sub), call(4, [1, 2, 3, 4, 5], [6], tags=sub)])
    yield rollout([call(0, [1, 2], [3]), call(1, [1, 2, 3, 4], [5], continues=0),
                   call(2, [1, 2, 3, 4], [6], continues=0)])
    replies = [[30, 31], [40], [50, 51, 52]]
    calls = [call(0, [1, 2], [10])]
    calls += [call(1 + i, [1, 2, 10, 20], r, choice=(i, 3)) for i, r in enumerate(replies)]
    yield rollout([*calls, call(4, [1, 2, 10, 20, 50, 51, 52, 21], [60])])
    yield rollout([*calls, call(4, [1, 2, 10, 20, 50, 51, 99, 21], [60])])
    yield rollout([call(0, [1], [2]), call(1, [1, 2, 3], []), call(2, [1, 2, 3], [4])])


class Prompts(unittest.TestCase):
    def setUp(self):
        testing.install()
        self.fetched = []
        fetch = rollout_data.prompt_ids
        rollout_data.prompt_ids = lambda index: (self.fetched.append(index), fetch(index))[1]
        self.addCleanup(setattr, rollout_data, "prompt_ids", fetch)

    def test_a_rollout_hands_over_what_each_prompt_adds_and_serves_the_rest(self):
        r = rollout([
            call(0, [1, 2], [3], request={"messages": [{"role": "user", "content": "a"}]}),
            call(1, [1, 2, 3, 4], [5], response=chat("b")),
            # Re-rendered: shares [1, 2] only.
            call(2, [1, 2, 9, 4, 5, 6], [7]),
            call(3, [8], [9]),
        ])
        self.assertEqual([(c.prompt.extends, c.prompt.shared, c.prompt.tail) for c in r.calls],
                         [(None, 0, [1, 2]), (0, 3, [4]), (1, 2, [9, 4, 5, 6]), (None, 0, [8])])
        self.assertEqual(prompt_ids(r.calls[2]), [1, 2, 9, 4, 5, 6])
        self.assertEqual(prompt_len(r.calls[1]), 4)
        self.assertIn('"content":"a"', request_json(r.calls[0]))
        self.assertIn('"content":"b"', response_json(r.calls[1]))
        stray = dataclasses.replace(r.calls[1], index=7)
        with self.assertRaisesRegex(HostError, "call 7: the host has no response"):
            response_json(stray)

    def test_a_later_rollout_leaves_an_earlier_ones_data_alone(self):
        first = rollout([call(0, [1], [2], request={"n": 1}), call(1, [1, 2, 3], [4])])
        rollout([call(0, [5], [6], request={"n": 2}), call(1, [5, 6, 7, 8], [9])])
        self.assertEqual(request_json(first.calls[0]), '{"n":1}')
        self.assertEqual(prompt_ids(first.calls[1]), [1, 2, 3])

    def test_a_continuing_call_merges_by_its_tail_without_its_whole_prompt(self):
        [sample] = merge_chains(next(hand_made()))
        self.assertEqual(sample.response_ids, [10, 11, 20, 30, 21, 40])
        self.assertEqual(self.fetched, [])

    def test_a_linked_prompt_says_where_it_leaves_the_sample_as_a_whole_one_does(self):
        for prompt, at in [([1, 2, 10, 99], 3), ([1, 2, 10], 3), ([1, 7], 1), ([1, 2, 10, 11, 12], 4)]:
            r = rollout([call(0, [1, 2], [10, 11]), call(1, prompt, [5])])
            self.assertEqual(r.calls[1].prompt.extends, 0)
            whole = whole_prompts(r)
            self.assertEqual(SampleBuilder(r.calls[0]).first_difference(r.calls[1]), at)
            self.assertEqual(SampleBuilder(whole.calls[0]).first_difference(whole.calls[1]), at)
            self.assertEqual(SampleBuilder(r.calls[0]).continues(r.calls[1]), at == 4)

    def test_the_tail_merge_builds_what_whole_prompts_build(self):
        rollouts = list(hand_made())
        rollouts += testing.read_rollouts(FIXTURES / "rollouts.jsonl")
        rollouts += testing.read_rollouts(FIXTURES / "mini-swe/rollouts.jsonl")
        linked_calls = fetched = 0
        for r in rollouts:
            # Merged from the links first: the whole prompts below are fetched then.
            linked = {by: merge_chains(r, chain_by_agent=by) for by in (True, False)}
            linked_calls += sum(c.prompt.extends is not None for c in r.calls)
            fetched += len(self.fetched)
            self.fetched.clear()
            for by, samples in linked.items():
                whole = merge_chains(whole_prompts(r), chain_by_agent=by)
                self.assertEqual(samples, whole, f"rollout {r.id}, chain_by_agent={by}")
            self.fetched.clear()
        # Not vacuous: some linked calls merged by their tail alone.
        self.assertLess(fetched, linked_calls)


if __name__ == "__main__":
    unittest.main()
