"""Reward models (in-process, batched) and LLM judges (an OpenAI-compatible stub on 127.0.0.1) as reward terms."""

from __future__ import annotations

import json
import math
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest
import torch

from tests.rewards.helpers import StubJudge, closed_port_url, start_stub_judge, tiny_reward_model
from tether.config import ConfigError, RewardTermConfig
from tether.rewards import Judge, RewardedTask, RewardModel, RewardTerm, VerlScore, check_reward_terms
from tether.tasks import Score, TaskItem


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory, tokenizer):
    return tiny_reward_model(tmp_path_factory.mktemp("rm"), tokenizer)


@pytest.fixture
def judge_url():
    server, url = start_stub_judge()
    yield url
    server.shutdown()


def test_batched_reward_model_scores_equal_one_pair_at_a_time_in_float64(reward_model_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    rm = RewardModel(str(reward_model_dir), batch_size=3, device="cpu")
    prompts = ["What is 2+2?", [{"role": "user", "content": "Hi"}], "Name a colour.", "x"]
    completions = ["4", [{"role": "assistant", "content": "Hello there, friend"}], "blue", "a much longer reply"]
    scores = rm(prompts, completions)
    reference = AutoModelForSequenceClassification.from_pretrained(reward_model_dir).double().eval()
    tok = AutoTokenizer.from_pretrained(reward_model_dir)
    for prompt, completion, score in zip(prompts, completions, scores, strict=True):
        ids = tok(rm.render(prompt, completion), return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            expected = reference(**ids).logits[0, 0].item()  # one row: no padding at all
        assert score == pytest.approx(expected, abs=1e-4)
    assert len(set(scores)) == 4  # different pairs, different rewards


def test_text_parts_reach_a_reward_model_and_a_judge_as_their_text(reward_model_dir):
    """A dataset prompt may hold text parts (tether.models.chat): a reward model renders them as its template renders
    their joined text, a judge's prompt shows the text, never the list's repr."""
    from tether.rewards.judge import text_of

    rm = RewardModel(str(reward_model_dir), device="cpu")
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is"}, {"type": "text", "text": "2+2?"}]}]
    joined = [{"role": "user", "content": "What is\n2+2?"}]
    assert rm.render(parts, "4") == rm.render(joined, "4") and "'type'" not in rm.render(parts, "4")
    assert text_of(parts) == "user: What is\n2+2?"


def test_a_reward_model_term_is_built_once_and_checked_before_it_loads(reward_model_dir, tmp_path):
    spec = RewardTermConfig(fn="tether.rewards:RewardModel", kwargs={"model": str(reward_model_dir), "device": "cpu"})
    term = RewardTerm(spec, "task.rewards[0]")
    assert isinstance(term.fn, RewardModel) and term.name == "RewardModel"
    with pytest.raises(ConfigError, match=r"^task.rewards\[0\].kwargs: model: '/.*' is not a directory holding"):
        check_reward_terms([RewardTermConfig(fn="tether.rewards:RewardModel", kwargs={"model": str(tmp_path)})])
    with pytest.raises(ConfigError, match="needs 'model'"):
        check_reward_terms([RewardTermConfig(fn="tether.rewards:RewardModel")])


@pytest.mark.parametrize("alias", ["tiny-64x2", "smollm2-135m-instruct", "char-64x1"])
def test_a_policy_alias_as_the_reward_model_is_refused_before_it_loads(alias):
    """``model: tiny-64x2`` passed validate (read as a Hub id); train loaded the policy, then died with transformers'
    traceback after Hugging Face's retries: an alias names a policy (a causal LM), never a reward model."""
    with pytest.raises(ConfigError) as info:
        check_reward_terms([RewardTermConfig(fn="tether.rewards:RewardModel", kwargs={"model": alias})])
    assert str(info.value) == (f"task.rewards[0].kwargs: model: {alias!r} is a tether alias of a policy (a causal LM "
                               "without a reward head), not a reward model: give a local directory or a Hub id "
                               "(org/name) of an AutoModelForSequenceClassification checkpoint")


def test_a_reward_model_that_does_not_load_is_one_line_naming_its_entry(reward_model_dir, tmp_path):
    """A directory whose weights are missing passed the check (it holds a config.json) and stopped train with
    transformers' OSError traceback after the policy loaded."""
    import shutil

    broken = tmp_path / "rm"
    shutil.copytree(reward_model_dir, broken)
    (broken / "model.safetensors").unlink()
    spec = RewardTermConfig(fn="tether.rewards:RewardModel", kwargs={"model": str(broken), "device": "cpu"})
    check_reward_terms([spec])  # a config.json is there: only loading finds it out
    with pytest.raises(ConfigError) as info:
        RewardTerm(spec, "task.rewards[1]")
    message = str(info.value)
    assert message.startswith("task.rewards[1].kwargs: tether.rewards:RewardModel could not be built (OSError: "
                              "Error no file named model.safetensors") and "\n" not in message, message


def test_the_judge_fills_the_template_parses_and_scales(judge_url):
    judge = Judge("stub", base_url=judge_url, template="Gold: {answer}\nResponse:\n{completion}\n\nScore:",
                  pattern=r"Score: (\d+)", max_score=10, retry_delay_s=0)
    assert judge(["q", "q"], ["abc", "abcdefgh"], answer=["1", "2"]) == [0.3, 0.8]
    assert StubJudge.requests[0]["model"] == "stub" and StubJudge.requests[0]["temperature"] == 0.0
    assert {r["messages"][0]["content"].split("\n")[0] for r in StubJudge.requests} == {"Gold: 1", "Gold: 2"}


def test_the_judge_asks_each_prompt_once(judge_url):
    judge = Judge("stub", base_url=judge_url, retry_delay_s=0, concurrency=4)
    first = judge(["q"] * 6, ["same"] * 3 + ["other"] * 3)
    again = judge(["q"], ["same"])
    assert first == [0.4] * 3 + [0.5] * 3 and again == [0.4]
    assert len(StubJudge.requests) == 2 and judge.requests == 2


def test_judge_failures_are_contained_and_counted_as_faults(judge_url, tmp_path):
    spec = RewardTermConfig(fn="tether.rewards:Judge", kwargs={"model": "stub", "base_url": judge_url,
                                                               "retries": 2, "retry_delay_s": 0})
    task = RewardedTask(Clean(), [RewardTerm(spec, "task.rewards[0]")], keep_score=False,
                        fault_log=tmp_path / "faults.log")
    items = [TaskItem("q", None, id=str(i)) for i in range(3)]
    with pytest.warns(UserWarning, match="faulted"):
        ok, unparsed, crashed = task.score_batch(items, ["abcd", "???", "crash"])
    assert ok.reward == pytest.approx(0.4) and not ok.fault
    assert unparsed.fault and "no score in the judge's answer 'no idea'" in unparsed.error
    assert crashed.fault and "failed 2 times" in crashed.error
    assert unparsed.reward == crashed.reward == pytest.approx(0.4)  # the lowest clean reward of the batch
    assert sum(r["messages"][0]["content"].endswith("crash\n\nScore:") for r in StubJudge.requests) == 2  # retried


def test_an_unreachable_judge_faults_every_row_and_the_run_goes_on():
    judge = Judge("stub", base_url="http://127.0.0.1:9", retries=1, timeout_s=2)
    values = judge(["q", "q"], ["a", "b"])
    assert all(math.isnan(v) for v in values) and all("failed 1 times" in e for e in judge.last_errors)


def judge_config(tmp_path, base_url: str):
    config = tmp_path / "judge.yaml"
    config.write_text(f"run_dir: {tmp_path / 'run'}\nmodel: {{name: tiny-64x1}}\ntask:\n  name: parity\n  rewards:\n"
                      f"    - {{fn: tether.rewards:Judge, kwargs: {{model: m, base_url: '{base_url}'}}}}\n")
    return config


def test_validate_warns_when_nothing_answers_at_the_judges_url(tmp_path):
    """validate said ok with no server running, and training then faulted every row (Connection refused)."""
    from typer.testing import CliRunner

    from tether.cli import app

    url = closed_port_url()
    result = CliRunner().invoke(app, ["validate", str(judge_config(tmp_path, url))])
    assert result.exit_code == 0, result.output
    assert f"warning: task.rewards[0].kwargs.base_url: cannot connect to {url}/models (Connection refused); every " \
           "row of this reward would be a fault" in result.output
    server, served = start_stub_judge()  # a server that answers, even with an error status (501 to GET), is there
    try:
        result = CliRunner().invoke(app, ["validate", str(judge_config(tmp_path, served))])
    finally:
        server.shutdown()
    assert result.exit_code == 0 and "warning" not in result.output, result.output


def test_the_probe_names_a_bad_url_and_a_server_that_is_not_http():
    # the typos the probe exists for raised out of validate (exit 1): a port that is not a number, a bad IPv6
    # address, a port where something answers in another protocol
    import threading

    from tether.openai_chat import unreachable

    assert unreachable("http://localhost:80O0/v1").startswith("http://localhost:80O0/v1/models is not a valid URL")
    assert "is not a valid URL" in unreachable("http://[::1/v1")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def speak_ssh() -> None:
            connection, _ = listener.accept()
            with connection:
                connection.recv(1024)
                connection.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")

        thread = threading.Thread(target=speak_ssh, daemon=True)
        thread.start()
        port = listener.getsockname()[1]
        line = unreachable(f"http://127.0.0.1:{port}/v1")
        thread.join(5)
    assert line == f"http://127.0.0.1:{port}/v1/models answers, but not as an HTTP server (BadStatusLine)", line


def test_the_judges_url_is_probed_by_validate_only(tmp_path, monkeypatch):
    """A start must not wait on the network: the probe is not one of the checks every command runs."""
    from tether.checks import check_config
    from tether.checks.machine import probe_endpoints
    from tether.config import load_config

    def no_probe(**kwargs):
        raise AssertionError("probed outside tether validate")

    cfg = load_config(judge_config(tmp_path, closed_port_url()))
    monkeypatch.setattr(Judge, "probe_endpoint", staticmethod(no_probe))
    check_config(cfg)
    with pytest.raises(AssertionError):
        probe_endpoints(cfg)


@pytest.mark.parametrize("kwargs, message", [
    ({"model": "m", "base_url": "localhost:8000"}, "not an http"),
    ({"model": "m", "base_url": "http://x", "template": "no slot"}, "must contain {completion}"),
    ({"model": "m", "base_url": "http://x", "pattern": r"\d+"}, "has no group"),
    ({"model": "m", "base_url": "http://x", "concurrency": 0}, "concurrency"),
])
def test_bad_judge_settings_are_one_line(kwargs, message):
    with pytest.raises(ConfigError, match=message) as err:
        check_reward_terms([RewardTermConfig(fn="tether.rewards:Judge", kwargs=kwargs)])
    assert str(err.value).startswith("task.rewards[0].kwargs")


class Clean:
    name, system_prompt = "clean", None

    def score(self, item, text):
        return Score(0.0, False, text)


VERL_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    if solution_str == "boom":
        raise RuntimeError("boom")
    if data_source == "dict":
        return {"score": 0.5, "acc": True}
    return float(solution_str.strip() == ground_truth) + bonus
'''


def test_a_verl_compute_score_runs_unchanged_and_faults_per_row(tmp_path):
    file = tmp_path / "verl_reward.py"
    file.write_text(VERL_REWARD)
    spec = RewardTermConfig(fn="tether.rewards:VerlScore", kwargs={"path": str(file),
                                                                   "reward_kwargs": {"bonus": 0.25}})
    task = RewardedTask(Clean(), [RewardTerm(spec, "task.rewards[0]")], keep_score=False)
    items = [TaskItem("q", "7", meta={"columns": {"data_source": d}}, id=str(i))
             for i, d in enumerate(["gsm8k", "gsm8k", "dict", "gsm8k"])]
    with pytest.warns(UserWarning, match="compute_score raised RuntimeError: boom"):
        right, wrong, as_dict, boom = task.score_batch(items, ["7", "8", "x", "boom"])
    assert (right.reward, wrong.reward, as_dict.reward) == (1.25, 0.25, 0.5)
    assert boom.fault and boom.reward == 0.25 and not right.fault
    with pytest.raises(ConfigError, match=r"kwargs: name: .* has no function 'score'"):
        check_reward_terms([RewardTermConfig(fn="tether.rewards:VerlScore",
                                             kwargs={"path": str(file), "name": "score"})])


@pytest.mark.parametrize("kwargs, message", [
    # verl's gsm8k scorer, compute_score(solution_str, ground_truth, ...), as a custom function: verl passes data_source
    ({"name": "gsm8k_style"}, "gsm8k_style(solution_str, ground_truth, method='strict') cannot take verl's call "
                              "compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...): "
                              "got an unexpected keyword argument 'data_source'"),
    ({"reward_kwargs": {"bonsu": 0.25}}, "compute_score(data_source, solution_str, ground_truth, extra_info=None, "
                                         "bonus=0.0) cannot take verl's call compute_score(data_source=..., "
                                         "solution_str=..., ground_truth=..., extra_info=..., bonsu=...): got an "
                                         "unexpected keyword argument 'bonsu'"),
    ({"name": "compute_scor"}, "has no function 'compute_scor'; did you mean 'compute_score'?"),
])
def test_a_verl_function_that_cannot_take_verls_call_is_refused_before_any_row(tmp_path, kwargs, message):
    """Each was "ok" from validate, then every row of the run faulted with a TypeError (reward 0 throughout)."""
    file = tmp_path / "verl_reward.py"
    file.write_text(VERL_REWARD + "\n\ndef gsm8k_style(solution_str, ground_truth, method='strict'):\n    return 0.0\n")
    with pytest.raises(ConfigError) as info:
        check_reward_terms([RewardTermConfig(fn="tether.rewards:VerlScore", kwargs={"path": str(file), **kwargs})])
    assert str(info.value).startswith("task.rewards[0].kwargs: name: ") and str(info.value).endswith(message)
    check_reward_terms([RewardTermConfig(fn="tether.rewards:VerlScore",  # the file's own function and keyword
                                         kwargs={"path": str(file), "reward_kwargs": {"bonus": 0.25}})])


VERL_TYPED_SCORES = '''
import numpy as np
import torch


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    value = len(solution_str) / 4
    kinds = {"tensor": torch.tensor(value), "numpy": np.float32(value), "dict_tensor": {"score": torch.tensor(value)},
             "array": np.array([value]), "none": None}
    return kinds[data_source]
'''


def test_a_verl_score_may_be_a_0d_tensor_or_numpy_scalar_as_verl_takes_it(tmp_path):
    """verl writes the score into a tensor, which takes a 0-d tensor; tether faulted it ("not a number")."""
    file = tmp_path / "typed.py"
    file.write_text(VERL_TYPED_SCORES)
    score = VerlScore(str(file))
    kinds = ["tensor", "numpy", "dict_tensor", "array", "none"]
    values = score(["q"] * 5, ["ab", "abc", "abcd", "a", "a"], data_source=kinds, answer=[None] * 5)
    assert values[:3] == [0.5, 0.75, 1.0] and all(math.isnan(v) for v in values[3:])
    assert score.last_errors[:3] == [None, None, None] and all("not a number" in e for e in score.last_errors[3:])


def test_a_reward_model_whose_config_pads_with_another_token_than_its_tokenizer_scores_rows_as_alone(
        tmp_path, tokenizer):
    from transformers import AutoModelForSequenceClassification, LlamaConfig, LlamaForSequenceClassification

    # config pad id 0 (<|endoftext|>), tokenizer pad token <|im_end|> (2): HF's head looks for id 0 to find a row's end
    assert tokenizer.pad_token_id != 0
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, num_labels=1, pad_token_id=0,
                         max_position_embeddings=512)
    LlamaForSequenceClassification(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    rm = RewardModel(str(tmp_path), batch_size=2, device="cpu")
    prompts, completions = ["What is 2+2?", "x"], ["4", "a much longer reply than the other one"]
    scores = rm(prompts, completions)
    reference = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    for prompt, completion, score in zip(prompts, completions, scores, strict=True):
        ids = rm.tokenizer(rm.render(prompt, completion), return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            expected = reference(**ids).logits[0, 0].item()  # one row: no padding at all
        assert score == pytest.approx(expected, abs=1e-5)


def test_a_reward_model_without_a_chat_template_reads_the_special_tokens_its_tokenizer_adds(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        LlamaConfig,
        LlamaForSequenceClassification,
        PreTrainedTokenizerFast,
    )

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "what", "is", "two", "plus", "four", "hello", "there", "a", "b", "c"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                           special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                            sep_token="[SEP]").save_pretrained(tmp_path)
    torch.manual_seed(0)
    LlamaForSequenceClassification(LlamaConfig(
        vocab_size=len(words), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=1,
        num_key_value_heads=1, num_labels=1, pad_token_id=0, max_position_embeddings=64)).save_pretrained(tmp_path)
    rm = RewardModel(str(tmp_path), batch_size=2, device="cpu")
    assert not rm.tokenizer.chat_template
    prompts, completions = ["what is two plus two", "hello"], ["four", "a b c there"]
    scores = rm(prompts, completions)
    reference = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    tok = AutoTokenizer.from_pretrained(tmp_path)
    for prompt, completion, score in zip(prompts, completions, scores, strict=True):
        ids = tok(f"{prompt}\n\n{completion}", return_tensors="pt")  # HF's own call: [CLS] ... [SEP]
        assert ids.input_ids[0, 0] == 2 and ids.input_ids[0, -1] == 3
        with torch.no_grad():
            expected = reference(**ids).logits[0, 0].item()
        assert score == pytest.approx(expected, abs=1e-5)


class CutOnceJudge(BaseHTTPRequestHandler):
    """Answers ``Score: <the number of characters of the response>``, except that its first answer to the response
    "cut" announces more bytes than it sends (a connection lost mid-body)."""

    cut: ClassVar[int] = 0
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        response = re.search(r"Response:\n(.*?)\n\nScore:", body["messages"][-1]["content"], re.DOTALL).group(1)
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": f"Score: {len(response)}"}}]})
        with self.lock:
            cut = response == "cut" and type(self).cut == 0
            type(self).cut += cut
        self.send_response(200)
        self.send_header("Content-Length", str(len(data) + (100 if cut else 0)))
        self.end_headers()
        self.wfile.write(data.encode())
        self.close_connection = cut

    def log_message(self, *args: Any) -> None:
        pass


def test_a_judge_answer_cut_short_is_retried_and_costs_no_other_row():
    CutOnceJudge.cut = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), CutOnceJudge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        judge = Judge("stub", base_url=f"http://127.0.0.1:{server.server_port}/v1", retries=2, retry_delay_s=0.0)
        scores = judge(["q"] * 3, ["ab", "cut", "abcd"])
    finally:
        server.shutdown()
    assert CutOnceJudge.cut == 1  # the first answer to "cut" was cut short; the retry got the whole one
    assert scores == [0.2, 0.3, 0.4] and judge.last_errors == [None, None, None]


def test_a_judge_template_keeps_json_examples_and_unknown_names_as_written():
    template = ('Question: {prompt}\nGold: {answer}\nResponse: {completion}\nUnknown: {nothing}\n'
                'Reply as {"score": 5} or {"score":0}, never {"a":1}.')
    judge = Judge("stub", base_url="http://127.0.0.1:9/v1", template=template)
    text = judge.judge_prompt("2+2?", [{"role": "assistant", "content": "4"}], {"answer": "4", "unused": "x"})
    assert text == ('Question: 2+2?\nGold: 4\nResponse: assistant: 4\nUnknown: {nothing}\n'
                    'Reply as {"score": 5} or {"score":0}, never {"a":1}.')
