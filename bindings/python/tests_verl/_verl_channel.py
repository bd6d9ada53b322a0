"""Peers of the wsync checkpoint engine's request channel that are not rollout workers, for the
authentication tests: raw clients (no secret, a wrong one, a replayed transcript) and a relay
between a rollout worker and the master that records what the worker sends, can replay the
worker's handshake proof on a connection of its own first, and can flip a bit of the first
request frame the master sends."""

import os
import socket
import struct
import threading

HEADER = struct.Struct("!cI")
NONCE = 32
MAC = 32
CHALLENGE_BYTES = HEADER.size + NONCE


def recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            raise ConnectionError("closed")
        buf += part
    return bytes(buf)


def recv_all(sock, timeout=20.0):
    """Everything the peer sends until it closes (True) or ``timeout`` passes (False)."""
    sock.settimeout(timeout)
    buf = bytearray()
    while True:
        try:
            part = sock.recv(65536)
        except socket.timeout:
            return bytes(buf), False
        except (ConnectionResetError, BrokenPipeError):
            return bytes(buf), True
        if not part:
            return bytes(buf), True
        buf += part


def is_challenge(data):
    """Whether ``data`` is exactly one challenge frame: the master's nonce, nothing else."""
    return len(data) == CHALLENGE_BYTES and data[:HEADER.size] == HEADER.pack(b"C", NONCE)


def send_after_challenge(address, payload, timeout=20.0):
    """Connects, reads the challenge, sends ``payload`` (bytes, or a function of the master's
    nonce), then reads until the master closes. Returns (challenge, what came after, closed,
    the local port)."""
    sock = socket.create_connection(tuple(address), timeout=timeout)
    port = sock.getsockname()[1]
    try:
        challenge = recv_exact(sock, CHALLENGE_BYTES)
        data = payload(challenge[HEADER.size:]) if callable(payload) else payload
        try:
            sock.sendall(data)
        except OSError:
            pass
        rest, closed = recv_all(sock, timeout)
        return challenge, rest, closed, port
    finally:
        sock.close()


def proof(secret, index, master_nonce):
    """A proof frame as a rollout worker makes it, with ``secret``."""
    from wsync.integrations.verl import _handshake_macs

    worker_nonce = os.urandom(NONCE)
    mac = _handshake_macs(secret, index, master_nonce, worker_nonce)[0]
    body = struct.pack("!I", index) + worker_nonce + mac
    return HEADER.pack(b"P", len(body)) + body


class Relay:
    """Relays one rollout worker's connection to the master (address ``upstream``)."""

    def __init__(self, upstream, replay=None, hold=None, tamper_request=False):
        """``replay``: True replays the worker's proof, bytes replay those, on a connection of
        the relay's own before the worker's proof goes on (the master is still waiting for
        this worker meanwhile); ``hold``: a function called then too, before it goes on."""
        self.upstream = tuple(upstream)
        self.replay = replay
        self.hold = hold
        self.tamper_request = tamper_request
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = ["127.0.0.1", self.listener.getsockname()[1]]
        self.sent = bytearray()  # what the worker sent the master
        self.replayed = None  # send_after_challenge's result for the replayed proof
        self.tampered = None  # the index of the master's frame that was changed
        self.errors = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        try:
            down, _ = self.listener.accept()
            up = socket.create_connection(self.upstream)
        except OSError as exc:
            self.errors.append(repr(exc))
            return
        threading.Thread(target=self._worker_to_master, args=(down, up), daemon=True).start()
        self._master_to_worker(up, down)

    @staticmethod
    def _cut(*socks):
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _worker_to_master(self, down, up):
        try:
            head = recv_exact(down, HEADER.size)
            frame = head + recv_exact(down, HEADER.unpack(head)[1])  # the worker's proof
            self.sent += frame
            if self.replay is not None:  # on a connection of ours, first
                self.replayed = send_after_challenge(
                    self.upstream, frame if self.replay is True else self.replay)
            if self.hold is not None:
                self.hold()
            up.sendall(frame)
            while True:
                data = down.recv(65536)
                if not data:
                    break
                self.sent += data
                up.sendall(data)
        except (OSError, ConnectionError) as exc:
            self.errors.append(repr(exc))
        finally:
            self._cut(down, up)

    def _master_to_worker(self, up, down):
        count = 0
        try:
            while True:
                head = recv_exact(up, HEADER.size)
                kind, n = HEADER.unpack(head)
                # the challenge and the master's proof carry no frame HMAC; later frames do
                body = bytearray(recv_exact(up, n + (MAC if count >= 2 else 0)))
                if self.tamper_request and kind == b"R" and self.tampered is None and n:
                    body[n // 2] ^= 0x01
                    self.tampered = count
                down.sendall(head + bytes(body))
                count += 1
        except (OSError, ConnectionError):
            pass
        finally:
            self._cut(down, up)

    def close(self):
        self.listener.close()
        self._thread.join(timeout=10)
