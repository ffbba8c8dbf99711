"""The release glue's helpers (engine/serving/real/fakes.py): `call_with` fills a function's arguments from what is
known, reading each function's parameters once; `run_on` runs a coroutine on the worker's one loop and cancels the
tasks it left, as asyncio.run does."""

from __future__ import annotations

import asyncio

from engine.serving.real.fakes import Permissive, call_with, parameters_of, run_on


class Server:
    def __init__(self, name: str) -> None:
        self.name = name

    def build(self, request, *extra, tokenizer=None, level: int = 3, **more):
        return (self.name, request, extra, tokenizer, level, more)


class Unhashable:
    __hash__ = None  # type: ignore[assignment]

    def __call__(self, request, mode="plain"):
        return (request, mode)


def test_call_with_fills_known_then_defaults_then_a_permissive() -> None:
    first, second = Server("first"), Server("second")
    name, request, extra, tokenizer, level, more = call_with(first.build, {"tokenizer": "tok", "unused": 1})
    assert (name, extra, tokenizer, level, more) == ("first", (), "tok", 3, {})
    assert isinstance(request, Permissive) and request._name == "request"
    # The parameters are read once per function, whichever instance the method is bound to: each call still goes
    # to its own instance.
    assert call_with(second.build, {"request": "r"})[:2] == ("second", "r")
    assert parameters_of(first.build) is parameters_of(second.build)
    assert parameters_of(first.build) == (("request", True), ("tokenizer", False), ("level", False))
    # Positional arguments take the first parameters.
    assert call_with(first.build, {"level": 7}, "given")[1:5] == ("given", (), None, 7)
    assert call_with(Server, {"name": "made"}).name == "made"


def test_call_with_an_unhashable_callable() -> None:
    assert call_with(Unhashable(), {"request": "r"}) == ("r", "plain")
    assert call_with(Unhashable(), {"request": "r", "mode": "json"}) == ("r", "json")


def test_run_on_cancels_what_the_coroutine_left_and_keeps_the_loop() -> None:
    loop = asyncio.new_event_loop()
    ended: list[str] = []

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.append("cancelled")

    async def leaves_a_task() -> int:
        asyncio.get_running_loop().create_task(forever())
        await asyncio.sleep(0)  # the task starts
        return 1

    try:
        assert run_on(loop, leaves_a_task()) == 1
        assert ended == ["cancelled"]
        assert not asyncio.all_tasks(loop)
        assert run_on(loop, asyncio.sleep(0, result=2)) == 2  # the same loop, again
    finally:
        loop.close()
