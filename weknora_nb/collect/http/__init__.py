"""How to reach a WeKnora server or an OpenAI-compatible service over HTTP, and what its failures mean.

- :mod:`.client`: :class:`~.client.WeKnoraClient`, an httpx client for WeKnora's endpoints, and its
  :class:`~.client.ClientSettings`;
- :mod:`.envelope`: WeKnora's responses read, a failure mapped to its
  :class:`~weknora_nb.core.errors.RequestFailed` kind;
- :mod:`.retry`: the retry policy every client shares, and running a coroutine to the end from synchronous code;
- :mod:`.transport`: the httpx client on aiohttp's connection pool, its exceptions mapped to httpx's;
- :mod:`.service`: the settings an OpenAI-compatible service's client shares (the judge's LLM, the embeddings);
- :mod:`.redact`: secrets out of URLs, connection strings, command lines and log lines.
"""
