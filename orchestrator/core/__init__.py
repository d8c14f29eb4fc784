"""The decisions, with no I/O: settings, errors, the document model, every filter and
update (``queries``, one module per sender), the in-house pattern's leases during a
migration (``in_house``), backoff policies, the server-clock estimate, and the scheduler that
both runners follow. Nothing here touches pymongo, a thread or an event loop."""
