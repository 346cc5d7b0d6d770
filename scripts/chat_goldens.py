"""chat_goldens.py — writes tests/data/chat_builtin_goldens.json: llama.cpp's built-in chat templates
(llama_chat_apply_template in libllama, through ctypes) applied to a few conversations, by template name, so
tests/test_chat_builtin.py can check pi2/model/chat_builtin.py without llama.cpp.

Usage: python3 scripts/chat_goldens.py /path/to/libllama.so [OUT.json]
"""
from __future__ import annotations

import ctypes as C
import json
import sys
import time


class Msg(C.Structure):
    _fields_ = [("role", C.c_char_p), ("content", C.c_char_p)]


NAMES = ["chatml", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "mistral-v1", "mistral-v3",
         "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken", "phi3", "phi4", "falcon3", "zephyr", "monarch",
         "gemma", "llama3", "vicuna", "vicuna-orca"]
CHATS = [
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": " You are terse. "}, {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": " 4 "}, {"role": "user", "content": "And 3+3?\n"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke"}],
]


def main():
    lib = C.CDLL(sys.argv[1])
    f = lib.llama_chat_apply_template
    f.argtypes = [C.c_char_p, C.POINTER(Msg), C.c_size_t, C.c_bool, C.c_char_p, C.c_int32]
    f.restype = C.c_int32
    out = []
    for name in NAMES:
        for i, chat in enumerate(CHATS):
            for add in (True, False):
                msgs = (Msg * len(chat))(*[Msg(m["role"].encode(), m["content"].encode()) for m in chat])
                buf = C.create_string_buffer(8192)
                n = f(name.encode(), msgs, len(chat), add, buf, 8192)
                assert 0 <= n < 8192, (name, n)
                out.append({"template": name, "chat": i, "add_assistant": add, "text": buf.raw[:n].decode()})
    path = sys.argv[2] if len(sys.argv) > 2 else "tests/data/chat_builtin_goldens.json"
    with open(path, "w") as fh:
        json.dump({"provenance": {"llama.cpp": "0c1e57098bba43ac29e6e3b677cdceebdd22334f",
                                  "command": "python3 scripts/chat_goldens.py build/bin/libllama.so",
                                  "date": time.strftime("%Y-%m-%d")}, "chats": CHATS, "cases": out}, fh, indent=1)
    print(f"wrote {path}: {len(out)} cases")


if __name__ == "__main__":
    main()
