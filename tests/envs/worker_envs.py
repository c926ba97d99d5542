"""Envs that take a whole worker process down, for the Ray env-worker and env-process tests (they never misbehave
in the process that built the test, so running one in-process by mistake cannot kill pytest)."""

from __future__ import annotations

import os
import re
import time

from tether.envs.scripted import ScriptedEnv


class ProcessFaultEnv(ScriptedEnv):
    """The scripted env, except that outside process ``safe_pid`` it ``os._exit``s (with ``exit_code``) on its first
    step (``fault="exit"``: a native crash) or in its constructor (``"exit_init"``), or blocks its constructor
    (``fault="block"``: a regular expression that backtracks for minutes inside C while holding the GIL, so the
    worker's process stops answering altogether: a hang SafeEnv's thread timeouts cannot contain, unlike a
    ``time.sleep``)."""

    def __init__(self, *, process_fault: str, safe_pid: int, hang_s: float = 60.0, exit_code: int = 1,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.process_fault, self.armed, self.exit_code = process_fault, os.getpid() != safe_pid, exit_code
        if self.armed and process_fault == "exit_init":
            os._exit(exit_code)
        if self.armed and process_fault == "block":
            re.match(r"(a+)+$", "a" * int(hang_s) + "b")  # 2**hang_s steps in C, the GIL held throughout

    def step(self, action: str):
        if self.armed and self.process_fault == "exit":
            os._exit(self.exit_code)
        return super().step(action)


class ParseFaultEnv(ScriptedEnv):
    """The scripted env whose ``parse_action`` raises: the step that follows is a fault that judged no action (as a
    worker that died does, answering ``("", False)``). Harmless in any process: it raises, nothing more."""

    def parse_action(self, response_text: str) -> tuple[str, bool]:
        raise RuntimeError("parser crashed")


class SlowEnv(ScriptedEnv):
    """The scripted env, slow but within its limits: its constructor and ``reset`` each take ``reset_s``, its
    ``parse_action`` and ``step`` each ``act_s``."""

    def __init__(self, *, reset_s: float, act_s: float, **kwargs) -> None:
        time.sleep(reset_s)
        super().__init__(**kwargs)
        self.reset_s, self.act_s = reset_s, act_s

    def reset(self, seed: int):
        time.sleep(self.reset_s)
        return super().reset(seed)

    def parse_action(self, response_text: str) -> tuple[str, bool]:
        time.sleep(self.act_s)
        return super().parse_action(response_text)

    def step(self, action: str):
        time.sleep(self.act_s)
        return super().step(action)
