"""The SDK's data on demand: a hand-made rollout hands each prompt over
whole and serves each call's JSON from its own rollout, as the host serves
the rollout under way (the host's links between prompts, and fetching a
linked prompt, are checked through the host: plugin-host's python tests)."""

import dataclasses
import unittest

from agl_plugin import HostError, prompt_ids, prompt_len, request_json, response_json, testing
from agl_plugin.testing import call, chat, rollout


class Data(unittest.TestCase):
    def setUp(self):
        testing.install()

    def test_a_rollout_hands_over_whole_prompts_and_serves_the_json(self):
        r = rollout([
            call(0, [1, 2], [3], request={"messages": [{"role": "user", "content": "a"}]}),
            call(1, [1, 2, 3, 4], [5], response=chat("b")),
        ])
        self.assertEqual([(c.prompt.extends, c.prompt.shared, c.prompt.tail) for c in r.calls],
                         [(None, 0, [1, 2]), (None, 0, [1, 2, 3, 4])])
        self.assertEqual(prompt_ids(r.calls[1]), [1, 2, 3, 4])
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


if __name__ == "__main__":
    unittest.main()
