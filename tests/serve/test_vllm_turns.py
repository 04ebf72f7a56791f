"""serve/vllm.py's ModelTurns: base and adapter requests take turns on the vLLM server,
each side's requests share a turn, and a waiting side is not overtaken."""

import asyncio

from ponder.serve.vllm import ModelTurns


def test_sides_take_turns_and_a_waiting_side_is_not_overtaken():
    async def scenario() -> list[str]:
        turns, log = ModelTurns(), []
        gates = {name: asyncio.Event() for name in ("b1", "a1", "b2", "a2")}

        async def request(name: str, key: str) -> None:
            async with turns.turn(key):
                log.append(f"+{name}")
                await gates[name].wait()
                log.append(f"-{name}")

        tasks = [asyncio.create_task(request("b1", "base"))]
        await asyncio.sleep(0)
        tasks.append(asyncio.create_task(request("a1", "adapters")))  # waits: the base runs
        await asyncio.sleep(0)
        tasks.append(asyncio.create_task(request("b2", "base")))  # waits behind a1, though the base runs
        tasks.append(asyncio.create_task(request("a2", "adapters")))
        await asyncio.sleep(0.01)
        assert log == ["+b1"] and turns.active == 1
        gates["b1"].set()
        await asyncio.sleep(0.01)
        assert log == ["+b1", "-b1", "+a1", "+a2"] and turns.active == 2  # both adapter requests at once
        gates["a1"].set()
        gates["a2"].set()
        gates["b2"].set()
        await asyncio.gather(*tasks)
        assert turns.active == 0
        return log

    assert asyncio.run(scenario()) == ["+b1", "-b1", "+a1", "+a2", "-a1", "-a2", "+b2", "-b2"]


def test_a_request_cancelled_while_it_waits_leaves_no_trace():
    async def scenario() -> None:
        turns, release = ModelTurns(), asyncio.Event()

        async def hold() -> None:
            async with turns.turn("base"):
                await release.wait()

        async def enter(key: str) -> None:
            async with turns.turn(key):
                pass

        holder = asyncio.create_task(hold())
        await asyncio.sleep(0)
        waiter = asyncio.create_task(enter("adapters"))
        await asyncio.sleep(0.01)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        release.set()
        await holder
        assert turns.active == 0
        await asyncio.wait_for(enter("adapters"), 1)  # nothing left waiting in its place
        assert turns.active == 0

    asyncio.run(scenario())
