"""The runners: thin layers that carry out the scheduler's decisions, one on threads
(``Orchestrator``), one on asyncio (``AsyncOrchestrator``)."""
