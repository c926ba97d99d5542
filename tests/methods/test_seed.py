"""SEED without a model: analyzer prompt, JSON parsing, skill insertion, rule analyzers, the OpenAI client, settings.

Expected texts are the authors' (seed/analysis.py, seed/prompting.py; seed.md Sec. 2.1-2.2 and Sec. 6).
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, HTTPServer
from types import SimpleNamespace
from typing import ClassVar

import pytest

from tether.config import ConfigError, load_command_config
from tether.envs import make_env
from tether.envs.base import escape_placeholders
from tether.methods import method_config
from tether.methods.seed.analyzer import (
    Step,
    analysis_prompt,
    analysis_target,
    extract_task,
    is_nontrivial_skill,
    parse_analysis,
    success_label,
)
from tether.methods.seed.openai_analyzer import OpenAIAnalyzer, repair_prompt
from tether.methods.seed.plugin import teacher_prompts
from tether.methods.seed.prompting import augment_with_skill, insert_after_task_line, user_message
from tether.methods.seed.rule_analyzers import Trajectory, rule_analysis, solve_from_observation

SEED_SFT = {"env": {"name": "frozenlake"}, "model": {"name": "char-64x1"}}
STEPS = [Step("You see a door.", "<think>open it</think><action>open door</action>", True),
         Step("The door is open.", "<action>fly</action>", False)]


# -- analyzer prompt ---------------------------------------------------------------------------


def test_failure_prompt_is_the_authors_text():
    assert analysis_prompt("  leave   the room ", STEPS, "failure") == (
        "Analyze the following agent episode and return ONLY valid JSON.\n\n"
        "You need to complete two fields:\n"
        "1. Write a concise episode_summary.\n"
        "2. Write one episode_skill that extracts the failed trajectory into avoidance rules: the core mistake and "
        "warning signs that agent should avoid. \n\n"
        "Important constraints:\n"
        "- Write episode_skill as one short policy-facing skill, not as retrospective explanation of the trajectory.\n"
        "- Return only these top-level fields: episode_summary, episode_skill.\n\n"
        'Return format:\n{\n  "episode_summary": "string",\n  "episode_skill": "string"\n}\n\n'
        "Episode context:\n"
        "- Task description: leave the room\n"
        "- episode_success: failure\n"
        "- Interaction trajectory: Step 0\nObservation: You see a door.\n"
        "Response: <think>open it</think><action>open door</action>\nAction valid: true\n"
        "Step 1\nObservation: The door is open.\nResponse: <action>fly</action>\nAction valid: false\n\n")


def test_outcome_instructions_and_summary_switch():
    success = analysis_prompt("t", STEPS, "success")
    assert "episode_success: success" in success and "successful trajectory into workflow" in success
    unknown = analysis_prompt("", STEPS, "unknown")
    assert "episode_success: unknown" in unknown and "If it succeeded, extract the successful workflow" in unknown
    assert "- Task description: (not available)" in unknown
    bare = analysis_prompt("t", STEPS, "failure", include_summary=False)
    assert "episode_summary" not in bare and "Return only this top-level field: episode_skill." in bare
    assert "step_skills" not in success  # episode_only: no critical-step skills asked for


def test_success_label_and_task_extraction():
    assert [success_label(r) for r in (1.0, 0.99, None)] == ["success", "failure", "unknown"]
    assert success_label(2.0, threshold=5.0) == "failure"
    assert extract_task("You are an agent. Your task is to:  put a mug\nin the sink") == "put a mug"
    assert extract_task("Your question: who?\n") == "who?"
    assert extract_task("nothing here") == ""


# -- parsing -----------------------------------------------------------------------------------

GOOD = '{"episode_summary": "Won in 3 moves.", "episode_skill": "Push the box right, then down."}'


@pytest.mark.parametrize("text", [
    GOOD,
    f"Here is my analysis:\n```json\n{GOOD}\n```\nDone.",                                  # fenced, with prose
    "{'episode_summary': 'Won in 3 moves.', 'episode_skill': 'Push the box right, then down.'}",  # single quotes
    '{"episode_summary": "Won in 3 moves.", "episode_skill": "Push the box right, then down.",}',  # trailing comma
    '{"note": 1} then ' + GOOD,                                                             # prefers episode_skill
])
def test_parse_accepts_what_the_code_accepts(text):
    result = parse_analysis(text)
    assert result.ok and result.error is None
    assert (result.summary, result.skill) == ("Won in 3 moves.", "Push the box right, then down.")


@pytest.mark.parametrize(("text", "error"), [
    ("I think the agent should push right.", "No JSON object found"),
    ('{"episode_summary": "x", "episode_skill": ', "Could not parse JSON object"),
    ("", "No JSON object found"),
])
def test_parse_reports_broken_answers(text, error):
    result = parse_analysis(text)
    assert not result.ok and error in result.error and result.skill == ""


@pytest.mark.parametrize("skill", ["", "   ", None])
def test_empty_skill_parses_but_does_not_count(skill):
    result = parse_analysis(json.dumps({"episode_summary": "s", "episode_skill": skill} if skill is not None
                                       else {"episode_summary": "s"}))
    assert result.error is None and not result.ok


@pytest.mark.parametrize("value", [None, [], {}, 3, ["", "  "]])
def test_a_null_or_non_text_skill_is_no_skill_not_its_python_spelling(value):
    """``"episode_skill": null`` was the skill "None": a success, and a teacher prompt holding ``[None]``."""
    result = parse_analysis(json.dumps({"episode_summary": None, "episode_skill": value}))
    assert result.error is None and not result.ok and result.skill == "" and result.summary == ""


def test_a_skill_written_as_a_list_of_lines_is_those_lines():
    result = parse_analysis(json.dumps({"episode_summary": "s", "episode_skill": ["avoid thin ice", "", 4, "go"]}))
    assert result.ok and result.skill == "avoid thin ice\ngo"


def test_parse_without_summary_and_the_sft_target():
    assert parse_analysis(GOOD, include_summary=False).summary == ""
    assert parse_analysis(analysis_target("a", "b")).skill == "b"
    assert json.loads(analysis_target("a", "b", include_summary=False)) == {"episode_skill": "b"}
    assert is_nontrivial_skill("push the box to the target") and not is_nontrivial_skill("push right")
    assert not is_nontrivial_skill("... ...")


# -- skill insertion ---------------------------------------------------------------------------

BLOCK = ("**Episode-Level Skill**\nRefer to this episode-level skill when deciding what action to take in the "
         "current episode:\n[Push right first.]")


def test_block_goes_right_after_the_task_line():
    from tether.rollout.multi_turn import Episode, build_prompt

    ep = Episode(env=None, task="Push the box.", group_id=0, episode_id=0, seed=0, observation="#P_X#",
                 admissible=["up"])
    prompt = build_prompt(ep, 2, "Reply with <action>up</action>.")
    out = augment_with_skill(prompt, "  Push right first. ")
    assert out == prompt.replace("Your task is to: Push the box.\n\n",
                                 f"Your task is to: Push the box.\n\n{BLOCK}\n\n", 1)


@pytest.mark.parametrize(("prompt", "expected"), [
    ("Intro.\nYour goal is to win.\nState.", f"Intro.\nYour goal is to win.\n\n{BLOCK}\n\nState."),
    ("Your question: who?", f"Your question: who?\n\n{BLOCK}"),
    ("State.\nNow it's your turn to act.", f"State.\n\n{BLOCK}\n\nNow it's your turn to act."),  # fallback 1
    ("Just a state.", f"Just a state.\n\n{BLOCK}"),                                           # fallback 2
])
def test_insertion_fallbacks(prompt, expected):
    assert augment_with_skill(prompt, "Push right first.") == expected


@pytest.mark.parametrize(("prompt", "expected"), [
    # no ":" or space after "is": not a task line (code 2cf2fad), so the block goes before the turn anchor
    ("Your goal is.\nBoard.\nNow it's your turn to act.",
     f"Your goal is.\nBoard.\n\n{BLOCK}\n\nNow it's your turn to act."),
    # a line break after "is" is the pattern's whitespace: the task line is the next one, the block follows it
    ("Your goal is\nreach G.\nBoard.", f"Your goal is\nreach G.\n\n{BLOCK}\n\nBoard."),
])
def test_goal_line_matches_the_authors_pattern(prompt, expected):
    assert augment_with_skill(prompt, "Push right first.") == expected


@pytest.mark.parametrize("skill", ["", "  \n "])
def test_empty_skill_returns_the_prompt_unchanged(skill):
    prompt = "  Your task is to: go.\n\nState.  "
    assert augment_with_skill(prompt, skill) == prompt
    assert insert_after_task_line(prompt, "") == prompt


def test_user_message_round_trips_through_the_chat_template(tokenizer):
    from tether.models import encode_chat

    message = "Your task is to: walk.\n\nCurrent observation (step 1):\nP__\n_O√\n\nReply with <action>up</action>."
    ids = encode_chat(tokenizer, message)
    assert user_message(tokenizer, ids) == message
    assert user_message(tokenizer, tokenizer("plain text, no template").input_ids) is None


class CountingTokenizer:
    """A tokenizer that counts its template renders, encodes and decodes, and otherwise is the tokenizer it wraps."""

    def __init__(self, tokenizer) -> None:
        self.wrapped, self.calls = tokenizer, Counter()

    def __getattr__(self, name: str):
        return getattr(self.wrapped, name)

    def apply_chat_template(self, *args, **kwargs):
        self.calls["apply_chat_template"] += 1
        return self.wrapped.apply_chat_template(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        self.calls["encode"] += 1
        return self.wrapped(*args, **kwargs)

    def decode(self, *args, **kwargs):
        self.calls["decode"] += 1
        return self.wrapped.decode(*args, **kwargs)


def test_teacher_prompts_render_the_frame_once_and_each_shared_prompt_once(tokenizer):
    from tether.models import encode_chat

    left, right, wait = (f"Your task is to: {goal}.\n\nCurrent observation:\n{obs}\n\nReply with an action."
                         for goal, obs in (("go left", "P_O"), ("go right", "O_P"), ("wait", "_P_")))
    plain = tokenizer("plain text, no template").input_ids  # no user message to recover: left out
    rows = [(left, "H1"), (left, "H1"), (left, "H2 <image>"), (right, "H1"), (wait, None), (wait, "H3"),
            (None, "H1")]
    batch = SimpleNamespace(info={}, prompt_ids=[encode_chat(tokenizer, m) if m else plain for m, _ in rows])
    counting = CountingTokenizer(tokenizer)
    kept, prompts, lost = teacher_prompts(batch, counting, [c for _, c in rows], insert_after_task_line)
    want = [i for i, (m, c) in enumerate(rows) if m and c]
    assert kept == want and lost == 1
    assert prompts == [encode_chat(tokenizer, insert_after_task_line(rows[i][0], escape_placeholders(rows[i][1])))
                       for i in want]  # token for token what each row's own rendering gives
    # 4 distinct prompts among the 6 rows with a context: each decoded once, 3 recovered and checked by one render
    # and encode each; 4 distinct teacher prompts, one render and encode each; the frame rendered once. Row by row
    # it was 6 decodes, 16 renders (frame, check, teacher prompt of each row) and 10 encodes.
    assert counting.calls == {"decode": 4, "apply_chat_template": 1 + 3 + 4, "encode": 3 + 4}
    counting.calls.clear()
    assert teacher_prompts(batch, counting, [c for _, c in rows], insert_after_task_line)[1] == prompts
    assert counting.calls["apply_chat_template"] == 3 + 4  # the next step reuses the tokenizer's frame


# -- rule analyzers ----------------------------------------------------------------------------


def play(env_name: str, seed: int, actions: list[str], **kwargs) -> Trajectory:
    """Run ``actions`` (strings; "" = a reply without an action tag) and return the trajectory."""
    env = make_env(env_name, **kwargs)
    reset = env.reset(seed)
    obs, turns, infos, won, ret = reset.observation, [], [reset.info], False, 0.0
    for action in actions:
        valid = action in (reset.admissible_actions or [action])
        step = env.step(action)
        turns.append({"observation": obs, "response": f"<action>{action}</action>", "action": action,
                      "valid": valid and bool(action)})
        infos.append(step.info)
        obs, won, ret = step.observation, step.won, ret + step.reward
        if step.done:
            break
    return Trajectory(task=reset.task, turns=turns, final_observation=obs, won=won, ret=ret, infos=infos)


@pytest.mark.parametrize("env_name", ["sokoban", "frozenlake"])
def test_solver_plan_from_the_observation_matches_the_env(env_name):
    env = make_env(env_name)
    for seed in range(3):
        obs = env.reset(seed).observation
        assert solve_from_observation(env_name, obs) == env.solution()
    assert solve_from_observation("textworld", "anything") is None


def test_sokoban_success_is_a_workflow_with_the_winning_order():
    env = make_env("sokoban")
    env.reset(3)
    moves = env.solution()
    traj = play("sokoban", 3, moves)
    assert traj.won
    result = parse_analysis(rule_analysis(traj, "sokoban", success=True))
    assert result.ok and f"Winning order here: {', '.join(moves)}." in result.skill
    assert result.summary.startswith(f"The agent succeeded in {len(moves)} turns")


def test_sokoban_failure_names_mistakes_and_the_plan():
    traj = play("sokoban", 3, ["up", "up", "", "jump", "right"])  # seed 3: the player starts against the top wall
    result = parse_analysis(rule_analysis(traj, "sokoban", success=False))
    assert result.ok and result.skill.startswith("Avoid: ")
    assert "2 of 5 turns (1 had no <action> tag)" in result.skill
    assert "Instead, from the start the winning moves were: down, left, left, left, down." in result.skill
    assert "ran out of turns" in result.summary and "moves that changed nothing" in result.summary


def test_frozenlake_hole_comes_first():
    traj = play("frozenlake", 3, ["right", "right"])  # seed 3: row 0 is "P_O_"
    assert not traj.won
    result = parse_analysis(rule_analysis(traj, "frozenlake", success=False))
    assert result.skill.startswith("Avoid: stepping onto a hole O: the move 'right' at step 1 fell in")
    assert "fell into a hole" in result.summary


def test_scripted_and_generic_analyzers():
    traj = play("scripted", 0, ["banana"], turns=1)
    result = parse_analysis(rule_analysis(traj, "scripted", success=False))
    assert "guessing words the task does not name (banana)" in result.skill and "say the word: apple" in result.skill
    generic = parse_analysis(rule_analysis(traj, "some_new_env", success=True, include_summary=False))
    assert generic.ok and generic.summary == "" and generic.skill == "Repeat the action order that won: banana."


# -- OpenAI-compatible endpoint ----------------------------------------------------------------


class _FakeChat(BaseHTTPRequestHandler):
    answers: ClassVar[list[str]] = []
    requests: ClassVar[list[dict]] = []

    def do_POST(self):  # http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"body": body, "auth": self.headers.get("Authorization")})
        answer = type(self).answers.pop(0)
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": answer}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def chat_server(monkeypatch):
    server = HTTPServer(("127.0.0.1", 0), _FakeChat)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("TEST_SEED_URL", f"http://127.0.0.1:{server.server_port}/v1")
    monkeypatch.setenv("TEST_SEED_MODEL", "glm-test")
    monkeypatch.setenv("TEST_SEED_KEY", "secret")
    _FakeChat.requests = []
    yield _FakeChat
    server.shutdown()


def _client(**kwargs) -> OpenAIAnalyzer:
    return OpenAIAnalyzer(base_url_env="TEST_SEED_URL", model_env="TEST_SEED_MODEL", api_key_env="TEST_SEED_KEY",
                          retry_delay=0.0, **kwargs)


def test_openai_analyzer_repairs_a_bad_answer(chat_server):
    chat_server.answers = ["not json", '{"episode_summary": "ok", "episode_skill": "push the box toward O"}']
    result = _client().analyze("PROMPT")
    assert result.ok and result.skill == "push the box toward O"
    first, second = (r["body"] for r in chat_server.requests)
    assert first["model"] == "glm-test" and first["temperature"] == 0.0 and first["max_completion_tokens"] == 1024
    assert chat_server.requests[0]["auth"] == "Bearer secret"
    assert second["messages"][0]["content"] == repair_prompt("PROMPT", "not json",
                                                             "No JSON object found in SEED analyzer response.")


def test_openai_analyzer_gives_up_after_parse_retries(chat_server):
    chat_server.answers = ['{"episode_skill": "too short"}', '{"episode_skill": ""}']
    result = _client(parse_retries=2).analyze("PROMPT")
    assert not result.ok and "episode_skill" in result.error and len(chat_server.requests) == 2


def test_openai_analyzer_needs_its_environment(monkeypatch):
    monkeypatch.delenv("NOPE_URL", raising=False)
    with pytest.raises(ValueError, match=r"\$NOPE_URL"):
        OpenAIAnalyzer(base_url_env="NOPE_URL")


# -- settings ----------------------------------------------------------------------------------


def test_settings_defaults_are_the_papers_and_unknown_keys_fail():
    s = method_config("seed", {})
    assert (s.opd_coef, s.gate_beta, s.analysis_max_new_tokens, s.analysis_context_length) == (0.01, 5.0, 4096,
                                                                                               16384)
    stage_one = load_command_config("seed-sft", data={**SEED_SFT, "sft": {}}).sft  # stage 1: `tether seed-sft`
    assert (stage_one.epochs, stage_one.batch_size, stage_one.lr, stage_one.val_fraction, stage_one.data_seed) == \
        (3, 8, 5e-6, 0.1, 2026)
    with pytest.raises(ConfigError, match=r"methods\.seed\.opd_coeff"):
        method_config("seed", {"opd_coeff": 0.1})
    with pytest.raises(ConfigError, match=r"\n  sft\.analyzer: Input should be 'rule' or 'openai'"):
        load_command_config("seed-sft", data={**SEED_SFT, "sft": {"analyzer": "gpt"}})


def test_opd_schedule():
    s = method_config("seed", {"opd_start_after_steps": 2, "opd_stop_after_steps": 4})
    assert [s.opd_active(u) for u in range(1, 7)] == [False, False, True, True, False, False]
    assert all(method_config("seed", {}).opd_active(u) for u in (1, 100))
