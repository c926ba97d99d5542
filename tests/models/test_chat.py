"""encode_chat: the chat template with the assistant header appended."""

from __future__ import annotations

import pytest

from tether.models import encode_chat


def test_string_and_messages_agree(tokenizer):
    ids = encode_chat(tokenizer, "What is 7 + 5?")
    assert ids == encode_chat(tokenizer, [{"role": "user", "content": "What is 7 + 5?"}])
    text = tokenizer.decode(ids)
    assert text.endswith("<|im_start|>user\nWhat is 7 + 5?<|im_end|>\n<|im_start|>assistant\n")


def test_system_message_goes_first(tokenizer):
    text = tokenizer.decode(encode_chat(tokenizer, "hi", system="Be brief."))
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi")
    with pytest.raises(ValueError, match="start with a system message"):
        messages = [{"role": "system", "content": "a"}, {"role": "user", "content": "b"}]
        encode_chat(tokenizer, messages, system="c")


def test_no_template_falls_back_to_plain_text(tokenizer):
    class Plain:
        chat_template = None

        def __call__(self, text):
            return tokenizer(text)

    with pytest.warns(UserWarning, match="no chat template"):
        ids = encode_chat(Plain(), "hi", system="sys")
    assert tokenizer.decode(ids) == "sys\n\nhi\n\n"


def parts(*texts: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": text} for text in texts]


# A template that loops over text parts, as multimodal ones do (Qwen2-VL's, SmolVLM's): their texts back to back.
PARTS_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{% if m['content'] is string %}{{ m['content'] }}"
                  "{% else %}{% for p in m['content'] %}{{ p['text'] }}{% endfor %}{% endif %}{% endfor %}"
                  "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.mark.parametrize("template", ["smollm2", "char", "parts"])
def test_text_parts_render_as_the_template_renders_them_or_joined_with_a_newline(tokenizer, template):
    """SmolLM2's template raises on a part list (it adds the content to a string), the char model's prints its Python
    repr, a multimodal-style one loops over the parts: a list goes to a template only where it renders it as text."""
    from tether.models.char import char_tokenizer

    tok = char_tokenizer() if template != "smollm2" else tokenizer
    if template == "parts":
        tok.chat_template = PARTS_TEMPLATE
    messages = [{"role": "user", "content": parts("What is", "7 + 5?")}]
    ids = encode_chat(tok, messages, system="Be brief.")
    if template == "parts":  # the template's own rendering of the list, the parts' texts back to back
        assert tok.decode(ids) == "<system>Be brief.<user>What is7 + 5?<assistant>"
    else:  # as the texts joined with a newline
        assert ids == encode_chat(tok, "What is\n7 + 5?", system="Be brief.")
        assert "'type'" not in tok.decode(ids)
