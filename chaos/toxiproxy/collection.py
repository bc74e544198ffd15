"""The proxies and their toxics, changed as Toxiproxy's ProxyCollection and ToxicCollection change
them (proxy_collection.go, proxy.go, toxic_collection.go). Every operation runs on the event loop,
one at a time (the API holds `lock`).

- create: 409 for a taken name; enabled by default; a proxy that cannot listen is not created;
- update (POST/PATCH /proxies/{name}): fields the body leaves out keep their value; the proxy
  restarts only when its resolved listen address or its upstream changes, so re-saving the same
  proxy ("localhost:1234" for "127.0.0.1:1234" included) keeps its connections; toxics stay;
- populate: every entry checked first ("missing required field: name at proxy 2"); then, in
  order, a new name is created, an unchanged proxy is left exactly as it is (even when the entry
  says enabled: false), a changed one is replaced by a new proxy without toxics; the first
  failure stops there and is answered with the proxies done before it;
- reset: each proxy started (stopping at the first that cannot listen) and stripped of toxics.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from mqmeta.chaos.toxiproxy.datapath import (
    Close,
    ListenError,
    Proxy,
    ReadBuffers,
    next_toxic_number,
    resolved_listen,
)
from mqmeta.chaos.toxiproxy.model import (
    PROXY_COUNT_MAX,
    PROXY_EXISTS,
    PROXY_NOT_FOUND,
    TOXIC_COUNT_MAX,
    TOXIC_NOT_FOUND,
    AddressError,
    ApiError,
    ProxyInput,
    Toxic,
    ToxiproxyError,
    missing_field,
    new_toxic,
    populate_input,
    proxy_input,
    updated_toxic,
)


class PopulateError(ToxiproxyError):
    """A populate that stopped at an entry; `proxies` are those created or kept before it."""

    def __init__(self, error: ToxiproxyError, proxies: list[dict[str, Any]]) -> None:
        super().__init__(str(error))
        self.error = error
        self.proxies = proxies


class ProxyCollection:
    def __init__(self, rng: random.Random) -> None:
        self.proxies: dict[str, Proxy] = {}
        self.lock = asyncio.Lock()
        self._rng = rng
        self._buffers = ReadBuffers()

    def get(self, name: str) -> Proxy:
        proxy = self.proxies.get(name)
        if proxy is None:
            raise ApiError(404, PROXY_NOT_FOUND)
        return proxy

    # --- proxies --------------------------------------------------------------------------------

    async def create(self, body: object) -> dict[str, Any]:
        given = proxy_input(body)
        if not given.name:
            raise missing_field("name")
        if not given.upstream:
            raise missing_field("upstream")
        return (await self._add(given)).to_json()

    async def _add(self, given: ProxyInput) -> Proxy:
        assert given.name and given.upstream is not None
        if given.name in self.proxies:
            raise ApiError(409, PROXY_EXISTS)
        if len(self.proxies) >= PROXY_COUNT_MAX:
            raise ApiError(400, f"too many proxies: at most {PROXY_COUNT_MAX}")
        proxy = Proxy(given.name, given.listen or "", given.upstream, self._rng, self._buffers)
        if given.enabled is not False:
            await proxy.start()
        self.proxies[proxy.name] = proxy
        return proxy

    async def update(self, name: str, body: object) -> dict[str, Any]:
        proxy = self.get(name)
        given = proxy_input(body)
        listen = proxy.listen if given.listen is None else given.listen
        upstream = proxy.upstream if given.upstream is None else given.upstream
        enabled = proxy.enabled if given.enabled is None else given.enabled
        if await _differs(proxy, listen, upstream):
            proxy.stop()
            proxy.listen, proxy.upstream = listen, upstream
        if enabled and not proxy.enabled:
            await proxy.start()
        elif not enabled and proxy.enabled:
            proxy.stop()
        return proxy.to_json()

    async def populate(self, body: object) -> list[dict[str, Any]]:
        """Creates or replaces proxies; raises PopulateError (or ApiError for a bad body)."""
        entries = populate_input(body)
        done: list[dict[str, Any]] = []
        for entry in entries:
            try:
                done.append((await self._add_or_replace(entry)).to_json())
            except ToxiproxyError as error:
                raise PopulateError(error, done) from None
        return done

    async def _add_or_replace(self, entry: ProxyInput) -> Proxy:
        assert entry.name and entry.upstream
        existing = self.proxies.get(entry.name)
        if existing is not None:
            if not await _differs(existing, entry.listen or "", entry.upstream):
                return existing  # untouched, whatever the entry says about enabled
            existing.stop()
            del self.proxies[entry.name]
            try:
                return await self._add(entry)
            except ToxiproxyError:
                self.proxies[entry.name] = existing  # Toxiproxy keeps the stopped proxy
                raise
        return await self._add(entry)

    async def delete(self, name: str) -> None:
        self.get(name).stop()
        del self.proxies[name]

    async def reset(self) -> None:
        """Enables every proxy and removes every toxic; stops at a proxy that cannot listen."""
        for proxy in list(self.proxies.values()):
            if not proxy.enabled:
                await proxy.start()
            removed, proxy.toxics = proxy.toxics, []
            proxy.toxics_changed(
                {t.position for t in removed}, close=any(t.type == "timeout" for t in removed)
            )

    def shutdown(self) -> None:
        for proxy in self.proxies.values():
            proxy.stop(Close.ABORT)

    # --- toxics ---------------------------------------------------------------------------------

    def add_toxic(self, name: str, body: object) -> dict[str, Any]:
        proxy = self.get(name)
        number = next_toxic_number()
        toxic = new_toxic(body, {t.name for t in proxy.toxics}, position=number, key=number)
        if len(proxy.toxics) >= TOXIC_COUNT_MAX:
            raise ApiError(400, f"too many toxics on proxy {proxy.name}: at most {TOXIC_COUNT_MAX}")
        proxy.toxics.append(toxic)
        proxy.toxics_changed(set())
        return toxic.to_json()

    def get_toxic(self, name: str, toxic_name: str) -> Toxic:
        for toxic in self.get(name).toxics:
            if toxic.name == toxic_name:
                return toxic
        raise ApiError(404, TOXIC_NOT_FOUND)

    def update_toxic(self, name: str, toxic_name: str, body: object) -> dict[str, Any]:
        proxy, toxic = self.get(name), self.get_toxic(name, toxic_name)
        updated = updated_toxic(toxic, body, key=next_toxic_number())
        proxy.toxics[proxy.toxics.index(toxic)] = updated
        proxy.toxics_changed({toxic.position})
        return updated.to_json()

    def remove_toxic(self, name: str, toxic_name: str) -> None:
        proxy, toxic = self.get(name), self.get_toxic(name, toxic_name)
        proxy.toxics.remove(toxic)
        proxy.toxics_changed({toxic.position}, close=toxic.type == "timeout")


async def _differs(proxy: Proxy, listen: str, upstream: str) -> bool:
    """Toxiproxy's Proxy.Differs: the listen address compared once resolved, the upstream as text."""
    try:
        resolved = await resolved_listen(listen)
    except AddressError as error:
        raise ListenError(str(error)) from None
    return proxy.listen != resolved or proxy.upstream != upstream
