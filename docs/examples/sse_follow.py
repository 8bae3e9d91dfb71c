"""A chat page whose every open tab follows the streamed answer (server-sent events).

Run it, then open http://127.0.0.1:8000/ in two browser tabs; ask in one and
watch the answer grow in both::

    pip install 'pai-storage[sql]' starlette uvicorn
    python docs/examples/sse_follow.py --url sqlite:///chat.db --port 8000

Routes:

``GET /``
    the page: a form, and an ``EventSource`` on ``/follow`` that shows the
    newest answer and then follows the next one.
``POST /ask`` (JSON ``{"text": ...}``)
    adds the question and streams a (fake) model's answer into the thread in
    the background; answers ``{"messageId": ...}`` once the reply is open, or
    409 while another answer is still streaming.
``GET /follow`` (query ``newerThan=<messageId>``: skip that answer)
    ``Conversation.follow()`` as server-sent events: one ``message`` event per
    change of the answer, ``{"messageId", "status", "text"}`` with the whole
    text so far, then one ``done`` event with the final record, and the
    stream ends. A tab that connects late starts with the text so far.

Every tab, in any server process, reads the same store: run several workers
(or several servers) on one PostgreSQL or MongoDB URL and the tabs still
follow each other's answers. See docs/watch.md for what it costs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import pai_storage

SCOPE, THREAD = "demo", "chat-1"  # a real app takes them from the session
INTERVAL = 0.05  # seconds between two looks on a backend that polls
log = logging.getLogger("sse_follow")
ANSWER = "Once upon a time, a store kept every word of a conversation, and every tab saw it."


async def fake_model(question: str) -> AsyncIterator[str]:
    """Stands in for a model's streaming API: a few words every 50 ms."""
    for word in f"You asked: {question}. {ANSWER}".split(" "):
        await asyncio.sleep(0.05)
        yield word + " "


def _event(name: str, message: pai_storage.Message) -> bytes:
    # Only what a browser needs; the whole text every time, so a tab that
    # missed an event (or reconnected) is still right after the next one.
    data = {"messageId": message.message_id, "status": message.status, "text": message.text}
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def make_app(url: str, **options: Any) -> Starlette:
    """The application on the store at ``url`` (``options`` as for ``pai_storage.connect``)."""
    answering: set[asyncio.Task[None]] = set()  # strong references to the running answers

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with pai_storage.connect(url, **options) as stores:
            app.state.threads = stores.threads
            yield
            for task in answering:
                task.cancel()  # an answer cut off by the shutdown ends "incomplete"
            await asyncio.gather(*answering, return_exceptions=True)

    def chat(request: Request) -> pai_storage.Conversation:
        threads: pai_storage.ThreadStore = request.app.state.threads
        return threads.conversation(SCOPE, THREAD, flush_every=0.1)

    async def ask(request: Request) -> Response:
        question = str((await request.json())["text"])
        conversation = chat(request)
        opened: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        async def answer() -> None:
            try:
                async with conversation.reply() as reply:
                    opened.set_result(reply.message_id)
                    async for chunk in fake_model(question):
                        await reply.write(chunk)
            except Exception as exc:
                if not opened.done():
                    opened.set_exception(exc)  # the reply did not open: the request says why
                else:  # stored as the message's status "error": every tab sees it end
                    log.exception("the answer failed")

        busy = JSONResponse({"error": "an answer is streaming; wait for it"}, status_code=409)
        thread = await conversation.get()
        if thread is not None and thread.lease is not None:
            return busy  # a reply holds the run lease (the check before the question is added)
        try:
            await conversation.add("user", question)
            task = asyncio.create_task(answer())
            answering.add(task)
            task.add_done_callback(answering.discard)
            message_id = await opened
        except pai_storage.ConversationConflictError:  # another tab asked at the same time
            return busy
        return JSONResponse({"messageId": message_id})

    async def follow(request: Request) -> Response:
        records = chat(request).follow(
            newer_than=request.query_params.get("newerThan"), interval=INTERVAL
        )

        async def events() -> AsyncIterator[bytes]:
            async with contextlib.aclosing(records):  # a closed tab stops its watch at once
                last: pai_storage.Message | None = None
                async for message in records:
                    last = message
                    yield _event("message", message)
                if last is not None:
                    yield _event("done", last)

        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    async def page(request: Request) -> Response:
        return HTMLResponse(PAGE)

    routes = [
        Route("/", page),
        Route("/ask", ask, methods=["POST"]),
        Route("/follow", follow),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


PAGE = """<!doctype html>
<meta charset="utf-8"><title>pai-storage: follow an answer</title>
<form id="ask"><input id="q" size="50" placeholder="Ask something"> <button>Ask</button></form>
<p id="status"></p><pre id="answer" style="white-space: pre-wrap"></pre>
<script>
const answer = document.getElementById("answer"), state = document.getElementById("status");
function follow(newerThan) {
  const query = newerThan ? "?newerThan=" + encodeURIComponent(newerThan) : "";
  const source = new EventSource("/follow" + query);
  source.addEventListener("message", (e) => {
    const m = JSON.parse(e.data);
    answer.textContent = m.text;
    state.textContent = m.status;
  });
  source.addEventListener("done", (e) => {  // this answer ended: follow the next one
    source.close();
    follow(JSON.parse(e.data).messageId);
  });
}
follow(null);
document.getElementById("ask").addEventListener("submit", async (e) => {
  e.preventDefault();
  const text = document.getElementById("q").value;
  const r = await fetch("/ask", {method: "POST", body: JSON.stringify({text})});
  if (!r.ok) state.textContent = (await r.json()).error;
});
</script>
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", default="sqlite:///sse-follow.db", help="store URL")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    # Open /follow streams would hold a graceful shutdown until every tab closed.
    app = make_app(args.url)
    uvicorn.run(
        app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=2
    )


if __name__ == "__main__":
    main()
