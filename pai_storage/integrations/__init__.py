"""Drop-in storage for agent frameworks, on pai-storage's public API.

One module per framework, each behind its own extra and importing its
framework only when the module itself is imported (``import pai_storage``
never imports any of them):

- :mod:`pai_storage.integrations.langgraph` (``pai-storage[langgraph]``):
  ``PaiCheckpointSaver`` (a ``BaseCheckpointSaver``) and ``PaiStore`` (a
  ``BaseStore``), both on the key-value store;
- :mod:`pai_storage.integrations.openai_agents` (``pai-storage[openai-agents]``):
  ``PaiSession``, the OpenAI Agents SDK's ``Session`` on the thread store;
- :mod:`pai_storage.integrations.adk` (``pai-storage[adk]``):
  ``PaiSessionService``, Google ADK's ``BaseSessionService`` on the thread
  store and the key-value store.

See ``docs/langgraph.md``, ``docs/openai-agents.md`` and ``docs/adk.md``.
"""
