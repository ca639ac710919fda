# A reward service for tests/reward/reward_http_test.cpp (rpg's reward_model.url client).
# Standard library only. Prints its port on the first line of stdout, then serves until
# killed.
#
#   POST /score   [{"data_source", "solution_str", "ground_truth", "extra_info"}, ...]
#                 -> [{"score": 1.0 if solution_str.strip() == ground_truth else 0.0,
#                      "pred": solution_str.strip(), "length": len(solution_str)
#                      [, "index": extra_info["index"]]}, ...]
#   GET /stats    {"posts": [{"batch": <entries>, "conn": <client port>, "dropped": bool}, ...]}
#                 in arrival order: the test checks batching, keep-alive and the number of
#                 connections from the client's side of each POST.
#
# Misbehaviours, to test the client's error paths:
#   --drop-first N   close the connection without a reply for the first N POSTs
#   --hang-on TEXT   never answer a batch with an entry whose solution_str == TEXT
#   --status CODE    answer every POST with CODE and a two-line text body
#   --bad-length     answer every POST with one entry too few
#   --reply TEXT     answer every POST with TEXT verbatim (status 200)
import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = None
lock = threading.Lock()
posts = []
drops_left = 0


def score(item):
    solution = item["solution_str"]
    out = {
        "score": 1.0 if solution.strip() == item["ground_truth"] else 0.0,
        "pred": solution.strip(),
        "length": len(solution),
    }
    extra = item.get("extra_info")
    if isinstance(extra, dict) and "index" in extra:
        out["index"] = extra["index"]
    return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one handler thread serves a connection's requests
    # Headers and body go out in two writes; with Nagle the body waits for the client's
    # delayed ACK (40 ms a reply on a kept-alive connection).
    disable_nagle_algorithm = True

    def log_message(self, format, *a):  # noqa: A002 - the base class's name
        pass

    def reply(self, status, body, content_type="application/json"):
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path != "/stats":
            self.reply(404, "not found\n", "text/plain")
            return
        with lock:
            body = json.dumps({"posts": posts})
        self.reply(200, body)

    def do_POST(self):
        global drops_left
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Type") != "application/json":
            self.reply(415, "expected Content-Type: application/json\n", "text/plain")
            return
        try:
            items = json.loads(body)
        except ValueError as e:
            self.reply(400, f"bad JSON: {e}\n", "text/plain")
            return
        with lock:
            drop = drops_left > 0
            if drop:
                drops_left -= 1
            posts.append({"batch": len(items), "conn": self.client_address[1], "dropped": drop})
        if drop:
            self.close_connection = True
            return
        if args.hang_on is not None and any(item["solution_str"] == args.hang_on for item in items):
            threading.Event().wait()  # forever: the client must give up on its own
        if args.status is not None:
            self.reply(args.status, "scorer crashed: ZeroDivisionError\nTraceback (most recent call last): ...\n",
                       "text/plain")
            return
        if args.reply is not None:
            self.reply(200, args.reply)
            return
        scores = [score(item) for item in items]
        if args.bad_length:
            scores = scores[:-1]
        self.reply(200, json.dumps(scores))


def main():
    global args, drops_left
    parser = argparse.ArgumentParser()
    parser.add_argument("--drop-first", type=int, default=0)
    parser.add_argument("--hang-on")
    parser.add_argument("--status", type=int)
    parser.add_argument("--bad-length", action="store_true")
    parser.add_argument("--reply")
    args = parser.parse_args()
    drops_left = args.drop_first
    ThreadingHTTPServer.request_queue_size = 64
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
