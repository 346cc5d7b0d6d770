"""pi2.serve.channel.Channel: the hand-off of a request's events from the engine thread to the event loop — a piece
put while the coroutine waits wakes it at once, a pause gathers what arrives and ends early on the request's end,
a non-streamed request's coroutine wakes only for the end, and nothing is lost or reordered."""
import asyncio
import threading
import time

from pi2.serve.channel import Channel


def _run(coro):
    return asyncio.run(coro)


def test_a_piece_from_another_thread_wakes_the_waiting_get_at_once():
    async def main():
        q = Channel(asyncio.get_running_loop())
        t0 = time.perf_counter()
        threading.Timer(0.05, q.put, ("piece", 1)).start()
        got = await asyncio.wait_for(q.get(), 5)
        return got, time.perf_counter() - t0
    got, dt = _run(main())
    assert got == [("piece", 1)]
    assert dt < 1.0       # woken by put, not by a timeout


def test_a_pause_gathers_the_pieces_and_the_end_cuts_it_short():
    async def main():
        q = Channel(asyncio.get_running_loop())
        for i in range(3):
            q.put("piece", i)
        first = await q.get()                  # already there: no wait
        t0 = time.perf_counter()
        th = threading.Thread(target=lambda: [q.put("piece", 3), q.put("piece", 4), time.sleep(0.05),
                                              q.put("done", None)])
        th.start()
        rest = await q.get(pause=30.0)         # the end wakes it long before 30 s
        th.join()
        return first, rest, time.perf_counter() - t0
    first, rest, dt = _run(main())
    assert first == [("piece", 0), ("piece", 1), ("piece", 2)]
    assert rest == [("piece", 3), ("piece", 4), ("done", None)]
    assert dt < 5.0


def test_a_pause_ends_after_its_time_with_what_arrived():
    async def main():
        q = Channel(asyncio.get_running_loop())
        q.put("piece", 0)
        t0 = time.perf_counter()
        got = await q.get(pause=0.1)
        return got, time.perf_counter() - t0
    got, dt = _run(main())
    assert got == [("piece", 0)]
    assert 0.09 <= dt < 2.0


def test_final_only_wakes_for_the_end_and_keeps_every_event():
    async def main():
        q = Channel(asyncio.get_running_loop(), final_only=True)
        task = asyncio.ensure_future(q.get())
        await asyncio.sleep(0)
        for i in range(50):
            q.put("piece", i)
        await asyncio.sleep(0.05)
        early = task.done()
        q.put("done", "x")
        return early, await asyncio.wait_for(task, 5)
    early, got = _run(main())
    assert not early
    assert got == [("piece", i) for i in range(50)] + [("done", "x")]


def test_a_cancelled_get_leaves_the_channel_usable():
    async def main():
        q = Channel(asyncio.get_running_loop())
        task = asyncio.ensure_future(q.get())
        await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        q.put("piece", 7)
        return await asyncio.wait_for(q.get(), 5)
    assert _run(main()) == [("piece", 7)]
