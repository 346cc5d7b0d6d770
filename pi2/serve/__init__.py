"""pi2.serve — `pi2 serve MODEL`: an OpenAI-compatible HTTP server (like llama-server) over pi2's Python API:
main.py runs it, app.py answers HTTP, slots.py schedules requests on the model's sequences, schema.py checks
requests and shapes answers. Needs the `serve` extra: pip install 'pi2[serve]' (starlette and uvicorn, both
pure-Python wheels: no Rust toolchain, which pydantic v2 would need, so it installs under Termux).
"""
