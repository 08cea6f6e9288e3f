"""The SDK's merge on hand-made rollouts (run by agl_build before it builds):
the host's rules, run natively by the agl binary (`agl plugin rules`)."""

import unittest

from agl_plugin import BreakKind, ChainBreak, Span, classify_break, merge_chains, testing
from agl_plugin.testing import call, chat, rollout

import app


@unittest.skipUnless(testing.agl_binary(), "no agl binary (AGL_BIN) to run the host's rules")
class Merge(unittest.TestCase):
    def setUp(self):
        testing.install()

    def test_a_continuing_call_joins_its_chain_with_the_observation_masked(self):
        r = rollout([
            call(0, [1, 2], [10, 11], [-0.5, -0.25], weight_version=4),
            call(1, [1, 2, 10, 11, 20, 21], [30], [-1.0], weight_version=3),
        ])
        [s] = app.build_samples(r)
        self.assertEqual(s.response_ids, [10, 11, 20, 21, 30])
        self.assertEqual(s.trainable, [Span(0, 2), Span(4, 5)])
        self.assertEqual(s.logprobs, [-0.5, -0.25, 0.0, 0.0, -1.0])
        self.assertEqual((s.source_calls, s.weight_version), ([0, 1], 3))

    def test_a_changed_prompt_breaks_the_chain_and_says_why(self):
        r = rollout([call(0, [1, 2], [10]), call(1, [1, 2, 99], [11]), call(2, [5], [], [])])
        first, second = app.build_samples(r)
        self.assertEqual(first.source_calls, [0])
        self.assertEqual(second.break_before.kind, BreakKind.TEMPLATE)
        self.assertIn("ids first differ at 2", second.break_before.detail)

    def test_agents_keep_their_own_chains(self):
        sub = {"x-agl-agent": "sub"}
        r = rollout([call(0, [1], [2]), call(1, [7], [8], tags=sub), call(2, [1, 2, 3], [4]),
                     call(3, [7, 8, 9], [10], tags=sub)])
        main, other = app.build_samples(r)
        self.assertEqual((main.source_calls, other.source_calls), ([0, 2], [1, 3]))
        self.assertEqual(other.agent, "sub")

    def test_config_turns_agent_chains_off(self):
        testing.install(config={"chain_by_agent": False})
        ask = lambda system: {"messages": [{"role": "system", "content": system},  # noqa: E731
                                           {"role": "user", "content": "go"}]}
        r = rollout([call(0, [1], [2], request=ask("main"), response=chat("hi")),
                     call(1, [7], [8], request=ask("helper"), tags={"x-agl-agent": "sub"})])
        self.assertEqual(app.build_samples(r)[1].break_before.kind, BreakKind.SUB_AGENT)
        testing.install(config={"chain_by_agent": True, "typo": 1})
        with self.assertRaisesRegex(ValueError, "unknown key"):
            app.build_samples(r)

    def test_each_choice_is_a_sample_and_the_kept_one_goes_on(self):
        replies = [[30, 31], [40], [50, 51, 52]]
        for kept in range(3):
            calls = [call(0, [1, 2], [10])]
            calls += [call(1 + i, [1, 2, 10, 20], r, choice=(i, 3)) for i, r in enumerate(replies)]
            calls.append(call(4, [1, 2, 10, 20, *replies[kept], 21], [60]))
            samples = app.build_samples(rollout(calls))
            self.assertEqual([s.source_calls[0] for s in samples], [0, 2, 3])
            self.assertTrue(all(s.break_before is None for s in samples))
            self.assertEqual([4 in s.source_calls for s in samples], [i == kept for i in range(3)])
        # An edited reply breaks against the choice it shares the most with.
        calls[4] = call(4, [1, 2, 10, 20, 50, 51, 99, 21], [60])
        broken = app.build_samples(rollout(calls))[3].break_before
        self.assertIn("previous 52, next 99", broken.detail)

    def test_a_harness_names_its_compaction_a_summary(self):
        ask = lambda *texts: {"messages": [{"role": "user", "content": t} for t in texts]}  # noqa: E731
        first = call(0, [1, 2], [3], request=ask("fix it"), response=chat("ok"))
        compacted = call(1, [1, 9], [4], request=ask("fix it", "Summary of the work so far: ..."))
        markers = ["Summary of the work so far"]
        r = rollout([first, compacted])
        found = merge_chains(r, summary_markers=markers)[1].break_before
        self.assertEqual((found.kind, found.call_index), (BreakKind.SUMMARY, 1))
        self.assertIn("compacted", found.detail)
        # Without the marker it is what the host's rules call it.
        plain = merge_chains(r)[1].break_before
        self.assertNotEqual(plain.kind, BreakKind.SUMMARY)
        self.assertEqual(classify_break(r.calls[0], r.calls[1]), plain)

    def test_an_adapter_names_breaks_its_own_way(self):
        r = rollout([call(0, [1, 2], [10]), call(1, [7], [8]), call(2, [7, 8, 9], [11])])
        own = lambda prev, nxt: ChainBreak(BreakKind.OTHER, nxt.index, f"after {prev.index}")  # noqa: E731
        samples = merge_chains(r, classify=own)
        self.assertEqual([s.source_calls for s in samples], [[0], [1, 2]])
        self.assertEqual(samples[1].break_before, ChainBreak(BreakKind.OTHER, 1, "after 0"))


if __name__ == "__main__":
    unittest.main()
