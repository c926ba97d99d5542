"""``tether show RUN_DIR``: sampled agent episodes, turn by turn, as text or HTML.

The agent loop appends one JSON line per sampled episode to ``RUN_DIR/transcripts.jsonl`` (the first
clone of up to four task groups per step): step, episode and group ids, env seed, task, outcome,
return, fault, and per turn the observation, the full response, the parsed action, its validity and
the env reward. A visual observation's images are PNG files under ``RUN_DIR/frames``, listed in the turn's
``frames``; the HTML page shows them.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any


def read_transcripts(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "transcripts.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: transcripts are written by agent (env) runs")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _head(ep: dict[str, Any]) -> str:
    fault = f"  FAULT {ep['fault']}" if ep.get("fault") else ""
    seed = f"  seed {ep['seed']}" if "seed" in ep else ""
    return (f"step {ep['step']}  episode {ep['episode']}  group {ep['group']}{seed}  "
            f"{'WON' if ep['won'] else 'lost'}  return {ep['return']:.2f}  turns {len(ep['turns'])}{fault}")


def format_episode(ep: dict[str, Any]) -> str:
    lines = [_head(ep), f"task: {ep['task']}"]
    if ep.get("x_skill"):
        lines.append(f"skill: {ep['x_skill']}")
    for i, t in enumerate(ep["turns"], 1):
        reward = f", reward {t['reward']:g}" if "reward" in t else ""
        lines.append(f"  [{i}] observation: {t['observation']}")
        if t.get("frames"):
            lines.append(f"      frames: {', '.join(t['frames'])}")
        lines += [f"      response: {t['response']}",
                  f"      action: {t['action']!r} ({'valid' if t['valid'] else 'INVALID'}{reward})"]
    return "\n".join(lines)


def show_transcripts(run_dir: Path, *, html: bool = False, limit: int = 3) -> str:
    """The last ``limit`` episodes as text; with ``html`` write them to RUN_DIR/transcripts.html instead."""
    episodes = read_transcripts(run_dir)[-limit:]
    if html:
        out = Path(run_dir) / "transcripts.html"
        out.write_text(to_html(episodes), encoding="utf-8")
        return f"wrote {out}"
    return "\n\n".join(format_episode(ep) for ep in episodes)


def _images(turn: dict[str, Any]) -> str:
    return "".join(f'<img src="{html.escape(path)}" alt="frame">' for path in turn.get("frames", ()))


def to_html(episodes: list[dict[str, Any]]) -> str:
    """A standalone page: one table per episode (turn, observation, response, action, reward)."""
    blocks = []
    for ep in episodes:
        rows = "".join(
            f"<tr><td>{i}</td><td><pre>{html.escape(t['observation'])}</pre>{_images(t)}</td>"
            f"<td><pre>{html.escape(t['response'])}</pre></td>"
            f"<td class={'ok' if t['valid'] else 'bad'}>{html.escape(t['action'])}</td>"
            f"<td>{t.get('reward', '')}</td></tr>"
            for i, t in enumerate(ep["turns"], 1))
        skill = f"<p><b>skill:</b> {html.escape(ep['x_skill'])}</p>" if ep.get("x_skill") else ""
        blocks.append(f"<h3>{html.escape(_head(ep))}</h3><p>{html.escape(ep['task'])}</p>{skill}"
                      "<table><tr><th>#</th><th>observation</th><th>response</th><th>action</th><th>reward</th></tr>"
                      f"{rows}</table>")
    style = ("<style>body{font-family:sans-serif}td{vertical-align:top;border-top:1px solid #ccc}"
             ".bad{color:#b00}.ok{color:#070}pre{white-space:pre-wrap;margin:0}</style>")
    return f"<!doctype html><html><head><meta charset=utf-8>{style}</head><body>{''.join(blocks)}</body></html>"
