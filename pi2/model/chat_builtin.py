"""chat_builtin.py — llama.cpp's built-in chat templates (src/llama-chat.cpp) by name, the detection of one from a
template's text (llm_chat_detect_template), and, for a file without a template, from its architecture and its
vocabulary's turn markers (Gemma-3's GGUFs carry none: its <start_of_turn> tokens say it is gemma).

Owns: BUILTINS (name -> render(messages, add_assistant) -> str), detect(text), detect_from_vocab(arch, pieces).
Does not: render Jinja templates (pi2/model/chat.py) or tokenize.
"""
from __future__ import annotations

_WS = " \t\n\r\f\v"


def _trim(s: str) -> str:
    return s.strip(_WS)


def _chatml(msgs, add):
    out = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs)
    return out + ("<|im_start|>assistant\n" if add else "")


def _mistral_v7(tekken):
    sp = "" if tekken else " "

    def render(msgs, add):
        out = []
        for m in msgs:
            if m["role"] == "system":
                out.append(f"[SYSTEM_PROMPT]{sp}{m['content']}[/SYSTEM_PROMPT]")
            elif m["role"] == "user":
                out.append(f"[INST]{sp}{m['content']}[/INST]")
            else:
                out.append(f"{sp}{m['content']}</s>")
        return "".join(out)
    return render


def _mistral_v1_v3(kind):
    lead = " " if kind == "v1" else ""
    trail = "" if kind == "v3-tekken" else " "

    def render(msgs, add):
        out, inside = [], False
        for m in msgs:
            if not inside:
                out.append(f"{lead}[INST]{trail}")
                inside = True
            if m["role"] == "system":
                out.append(m["content"] + "\n\n")
            elif m["role"] == "user":
                out.append(f"{m['content']}{lead}[/INST]")
            else:
                out.append(f"{trail}{_trim(m['content']) if kind == 'v3' else m['content']}</s>")
                inside = False
        return "".join(out)
    return render


def _llama2(system: bool, bos_inside: bool, strip: bool):
    def render(msgs, add):
        out, inside = ["[INST] "], True
        for m in msgs:
            content = _trim(m["content"]) if strip else m["content"]
            if not inside:
                inside = True
                out.append("<s>[INST] " if bos_inside else "[INST] ")
            if m["role"] == "system":
                out.append(f"<<SYS>>\n{content}\n<</SYS>>\n\n" if system else content + "\n")
            elif m["role"] == "user":
                out.append(content + " [/INST]")
            else:
                out.append(content + "</s>")
                inside = False
        return "".join(out)
    return render


def _tagged(fmt: str, tail: str):
    def render(msgs, add):
        return "".join(fmt.format(role=m["role"], content=m["content"]) for m in msgs) + (tail if add else "")
    return render


def _monarch(msgs, add):
    out = "".join(("" if i == 0 else "<s>") + f"{m['role']}\n{m['content']}</s>\n" for i, m in enumerate(msgs))
    return out + ("<s>assistant\n" if add else "")


def _gemma(msgs, add):
    out, system = [], ""
    for m in msgs:
        if m["role"] == "system":       # gemma has no system turn: merged into the next user turn
            system += _trim(m["content"])
            continue
        role = "model" if m["role"] == "assistant" else m["role"]
        out.append(f"<start_of_turn>{role}\n")
        if system and role != "model":
            out.append(system + "\n\n")
            system = ""
        out.append(_trim(m["content"]) + "<end_of_turn>\n")
    return "".join(out) + ("<start_of_turn>model\n" if add else "")


def _llama3(msgs, add):
    out = "".join(f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{_trim(m['content'])}<|eot_id|>" for m in msgs)
    return out + ("<|start_header_id|>assistant<|end_header_id|>\n\n" if add else "")


def _vicuna(orca: bool):
    def render(msgs, add):
        out = []
        for m in msgs:
            if m["role"] == "system":
                out.append(f"SYSTEM: {m['content']}\n" if orca else m["content"] + "\n\n")
            elif m["role"] == "user":
                out.append(f"USER: {m['content']}\n")
            elif m["role"] == "assistant":
                out.append(f"ASSISTANT: {m['content']}</s>\n")
        return "".join(out) + ("ASSISTANT:" if add else "")
    return render


BUILTINS = {
    "chatml": _chatml,
    "llama2": _llama2(False, False, False), "llama2-sys": _llama2(True, False, False),
    "llama2-sys-bos": _llama2(True, True, False), "llama2-sys-strip": _llama2(True, False, True),
    "mistral-v1": _mistral_v1_v3("v1"), "mistral-v3": _mistral_v1_v3("v3"),
    "mistral-v3-tekken": _mistral_v1_v3("v3-tekken"),
    "mistral-v7": _mistral_v7(False), "mistral-v7-tekken": _mistral_v7(True),
    "phi3": _tagged("<|{role}|>\n{content}<|end|>\n", "<|assistant|>\n"),
    "phi4": _tagged("<|im_start|>{role}<|im_sep|>{content}<|im_end|>", "<|im_start|>assistant<|im_sep|>"),
    "falcon3": _tagged("<|{role}|>\n{content}\n", "<|assistant|>\n"),
    "zephyr": _tagged("<|{role}|>\n{content}<|endoftext|>\n", "<|assistant|>\n"),
    "monarch": _monarch, "gemma": _gemma, "llama3": _llama3,
    "vicuna": _vicuna(False), "vicuna-orca": _vicuna(True),
}


def detect(text: str) -> str | None:
    """llm_chat_detect_template for the built-ins above: a built-in's name, or the one a template's text implies."""
    if text in BUILTINS:
        return text
    has = text.__contains__
    if has("<|im_start|>"):
        return "phi4" if has("<|im_sep|>") else "chatml"
    if text.startswith("mistral") or has("[INST]"):
        if has("[SYSTEM_PROMPT]"):
            return "mistral-v7"
        if has("' [INST] ' + system_message") or has("[AVAILABLE_TOOLS]"):
            return "mistral-v1" if has(" [INST]") else "mistral-v3-tekken" if has('"[INST]"') else "mistral-v3"
        if has("content.strip()"):
            return "llama2-sys-strip"
        if has("bos_token + '[INST]"):
            return "llama2-sys-bos"
        return "llama2-sys" if has("<<SYS>>") else "llama2"
    if has("<|assistant|>") and has("<|end|>"):
        return "phi3"
    if has("<|assistant|>") and has("<|user|>"):
        return "falcon3" if has("</s>") else None
    if has("<|user|>") and has("<|endoftext|>"):
        return "zephyr"
    if has("bos_token + message['role']"):
        return "monarch"
    if has("<start_of_turn>"):
        return "gemma"
    if has("USER: ") and has("ASSISTANT: "):
        return "vicuna-orca" if has("SYSTEM: ") else "vicuna"
    if has("<|start_header_id|>") and has("<|end_header_id|>"):
        return "llama3"
    return None


def detect_from_vocab(arch: str, pieces) -> str | None:
    """The built-in a file without a template implies: its architecture (gemma*) or the turn markers its vocabulary
    holds, checked in the order llm_chat_detect_template checks the same markers in a template."""
    if arch.startswith("gemma"):
        return "gemma"
    vocab = set(pieces)
    if "<|im_start|>" in vocab:
        return "phi4" if "<|im_sep|>" in vocab else "chatml"
    if "[SYSTEM_PROMPT]" in vocab:
        return "mistral-v7"
    if "[INST]" in vocab:
        return "mistral-v3"
    if "<|assistant|>" in vocab and "<|end|>" in vocab:
        return "phi3"
    if "<start_of_turn>" in vocab:
        return "gemma"
    if "<|start_header_id|>" in vocab and "<|eot_id|>" in vocab:
        return "llama3"
    return None
