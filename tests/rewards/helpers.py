"""A tiny random sequence-classification reward model, built here (no Hub), and a stub OpenAI-compatible judge."""

from __future__ import annotations

import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import torch


def tiny_reward_model(directory: Path, tokenizer: Any) -> Path:
    """A 1-layer, hidden-32 ``LlamaForSequenceClassification`` with one output and the SmolLM2 tokenizer."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, num_labels=1,
                         pad_token_id=tokenizer.pad_token_id, max_position_embeddings=512)
    LlamaForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


class StubJudge(BaseHTTPRequestHandler):
    """``/v1/chat/completions``: answers ``Score: <the number of characters of the response>`` for prompts whose
    response (after "Response:\\n") has one, "no idea" when the response is "???", and HTTP 500 for "crash"."""

    requests: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        prompt = body["messages"][-1]["content"]
        response = re.search(r"Response:\n(.*?)\n\nScore:", prompt, re.DOTALL).group(1)
        if response == "crash":
            self.send_response(500)
            self.end_headers()
            return
        answer = "no idea" if response == "???" else f"Score: {len(response)}"
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": answer}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def start_stub_judge() -> tuple[ThreadingHTTPServer, str]:
    """The stub on a free loopback port; (server, base URL). Call ``server.shutdown()`` after."""
    StubJudge.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), StubJudge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}/v1"


def closed_port_url() -> str:
    """A loopback URL nothing listens on: a port the system just gave out, closed again."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"
