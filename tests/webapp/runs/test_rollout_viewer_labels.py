"""The rollout viewer numbers turns from 1 as the playground does, says what generated each turn's
candidates, and says what its "team" column means (a solved episode's early turns show 0 there)."""

from __future__ import annotations

from django.urls import reverse

from tests.webapp.streams import episode
from webapp.models import Rollout


def test_turns_count_from_one_and_name_what_served_them(alice, alice_world):
    data = episode(3, success=True)
    for turn, policy in zip(data["turns"], ("adapter tool on tiny-random:llama", "adapter reasoner on tiny-random:llama")):
        turn["policy"] = policy
    Rollout.objects.create(run=alice_world.run, step=3, episode=0, success=True, agent_names=["tool", "reasoner"], data=data)
    html = alice.client.get(reverse("run_rollouts", args=[alice_world.run.pk])).content.decode()
    assert '<span class="turn-index">turn 1</span>' in html and '<span class="turn-index">turn 2</span>' in html
    assert "turn 0" not in html
    assert "by adapter tool on tiny-random:llama" in html and "by adapter reasoner on tiny-random:llama" in html
    assert ">team now</th>" in html and "earlier turns of a solved episode can show 0" in html


def test_episodes_recorded_before_policies_were_recorded_still_show(alice, alice_world):
    Rollout.objects.create(run=alice_world.run, step=1, episode=0, success=False, agent_names=["tool"], data=episode(1))
    html = alice.client.get(reverse("run_rollouts", args=[alice_world.run.pk])).content.decode()
    assert "turn 1" in html and 'class="served"' not in html


def test_a_candidates_tool_calls_show_with_their_arguments_and_results(alice, alice_world):
    data = episode(2)
    data["turns"][0]["candidates"][0]["calls"] = [
        {"name": "calculator", "arguments": {"expression": "238 * 83"}, "result": "19754", "error": ""},
        {"name": "abacus", "arguments": {}, "result": "", "error": "no tool 'abacus'; the tools are: calculator"},
        {"name": "", "arguments": {}, "result": "", "error": "the tool call is not valid JSON <script>"},
    ]
    Rollout.objects.create(run=alice_world.run, step=2, episode=0, success=False, agent_names=["tool"], data=data)
    html = alice.client.get(reverse("run_rollouts", args=[alice_world.run.pk])).content.decode()
    assert "tool call 1</span> <code>calculator({&quot;expression&quot;: &quot;238 * 83&quot;})</code><pre>19754</pre>" in html
    assert '<pre class="tool-error">no tool &#x27;abacus&#x27;; the tools are: calculator</pre>' in html
    assert "(unreadable)" in html and "<script>" not in html and "&lt;script&gt;" in html


def test_a_tool_turn_shows_in_the_order_it_happened(alice, alice_world):
    data = episode(2)
    data["turns"][0]["candidates"][0].update(
        text="<tool_call>{...}</tool_call>\nAnswer: 19754",
        segments=['Let me compute. <tool_call>{"name": "calculator"}</tool_call>', "So it is 19754.\nAnswer: 19754"],
        calls=[{"name": "calculator", "arguments": {"expression": "238 * 83"}, "result": "19754", "error": ""}],
    )
    Rollout.objects.create(run=alice_world.run, step=2, episode=0, success=True, agent_names=["tool"], data=data)
    html = alice.client.get(reverse("run_rollouts", args=[alice_world.run.pk])).content.decode()
    first, call, then = html.index("Let me compute."), html.index("tool call 1</span>"), html.index("So it is 19754.")
    assert first < call < then  # segment, its call and result, the next segment
    assert html.count('class="cand-text"') == len(data["turns"][0]["candidates"]) + 1 + sum(len(t["candidates"]) for t in data["turns"][1:])
