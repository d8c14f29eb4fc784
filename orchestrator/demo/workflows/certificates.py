"""Certificate provisioning for a runtime domain with a custom domain.

The step asks a certificate manager for a certificate, then relocks with progressive
backoff until it is Ready (waits of a tenth of the time spent so far: 0.1 s after 1 s,
1 s after 10 s, 3 s after 30 s), creates the ingress, and reaches Created. A failed
certificate is discarded and the step raises, so the next attempt requests a new one.

``CertManager`` stands in for cert-manager: a collection of requests that turn Ready
``delay`` seconds after they were made, by the orchestrator's (server) clock, so a
``FakeClock`` drives it in tests; the platform's ``Faults`` decide which ones fail.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pymongo import ReturnDocument
from pymongo.asynchronous.database import AsyncDatabase

from orchestrator import AsyncLease, AsyncOrchestrator, Outcome, Resource
from orchestrator.core.clock import as_utc

if TYPE_CHECKING:
    from orchestrator.demo.workflows.gateway import Faults

logger = logging.getLogger("orchestrator.demo.workflows.certificates")

CERTIFICATES = "certificates"
INGRESSES = "ingresses"

Recorder = Callable[[Any, str], Awaitable[None]]


class RuntimeDomain(Resource):
    collection = "runtimeDomains"
    unique = ("gateway_id",)

    gateway_id: Any
    gateway_name: str
    host: str
    custom_domain: str | None = None
    certificate_requests: int = 0  # kept across relocks and retries, unlike attempts


class CertificateFailed(RuntimeError):
    """The certificate manager gave up on a request; the next attempt asks again."""


class CertManager:
    """Certificate requests and ingresses, as the cluster would hold them."""

    def __init__(
        self,
        db: AsyncDatabase[dict[str, Any]],
        *,
        now: Callable[[], datetime],
        delay: float,
        faults: Faults,
        record: Recorder,
        max_requests: int = 5,
    ) -> None:
        if delay < 0:
            raise ValueError(f"certificate delay must be >= 0 s, not {delay!r}")
        self._certs = db[CERTIFICATES]
        self._ingresses = db[INGRESSES]
        self._now = now
        self.delay = delay
        self._faults = faults
        self._record = record
        self.max_requests = max_requests

    async def request(self, domain: RuntimeDomain) -> None:
        """Ask for a certificate of ``domain.custom_domain``; a pending request is kept."""
        host = _custom(domain)
        now = self._now()
        number = domain.certificate_requests
        fails = self._faults.should_fail(host, "certificate", number)
        await self._certs.update_one(
            {"_id": host},
            {
                "$setOnInsert": {
                    "status": "Pending",
                    "requestedAt": now,
                    "readyAt": now + timedelta(seconds=self.delay),
                    "outcome": "Failed" if fails else "Ready",
                }
            },
            upsert=True,
        )
        await self._record(domain.id, f"certificate:{number}")

    async def get(self, host: str) -> dict[str, Any] | None:
        """The request for ``host``; a due one turns Ready (or Failed) as it is read."""
        cert = await self._certs.find_one({"_id": host})
        if cert is None or cert["status"] != "Pending":
            return cert
        if as_utc(cert["readyAt"]) > self._now():
            return cert
        settled = await self._certs.find_one_and_update(
            {"_id": host, "status": "Pending"},
            {"$set": {"status": cert["outcome"]}},
            return_document=ReturnDocument.AFTER,
        )
        return settled if settled is not None else await self._certs.find_one({"_id": host})

    async def discard(self, host: str) -> None:
        await self._certs.delete_one({"_id": host})

    async def ensure_ingress(self, domain: RuntimeDomain) -> None:
        """Route the domain's hosts to the gateway, with TLS from its certificate."""
        await self._ingresses.update_one(
            {"_id": domain.host},
            {
                "$setOnInsert": {
                    "gatewayId": domain.gateway_id,
                    "customDomain": domain.custom_domain,
                    "tls": domain.custom_domain is not None,
                }
            },
            upsert=True,
        )
        await self._record(domain.id, "ingress")

    async def remove_ingress(self, host: str) -> None:
        await self._ingresses.delete_one({"_id": host})


def register_domains(orch: AsyncOrchestrator, certs: CertManager) -> None:
    @orch.phase(RuntimeDomain, "Creating", to="Created")
    async def create_domain(lease: AsyncLease[RuntimeDomain]) -> Outcome:
        domain = lease.resource
        if domain.custom_domain:
            cert = await certs.get(domain.custom_domain)
            if cert is None:
                await certs.request(domain)
                requests = domain.certificate_requests + 1
                return await _wait(lease, "certificate requested", certificate_requests=requests)
            if cert["status"] == "Failed":
                await certs.discard(domain.custom_domain)
                failed = f"certificate for {domain.custom_domain} failed"
                # Relocks reset ``attempts``, so the requests are what counts failures here.
                if domain.certificate_requests >= certs.max_requests:
                    return await lease.fail(f"{failed} {domain.certificate_requests} times")
                raise CertificateFailed(failed)
            if cert["status"] != "Ready":
                return await _wait(lease, "certificate not ready")
        await certs.ensure_ingress(domain)
        return await lease.advance("Created")


async def _wait(lease: AsyncLease[RuntimeDomain], why: str, **fields: Any) -> Outcome:
    outcome = await lease.relock(**fields)
    domain = lease.resource
    logger.info(
        "%s for %s; next check in %.2fs",
        why,
        domain.custom_domain,
        outcome.wait or 0.0,
        extra={
            "collection": lease.collection,
            "doc_id": str(lease.id),
            "phase": lease.phase,
            "outcome": outcome.action,
            "wait": outcome.wait,
        },
    )
    return outcome


def _custom(domain: RuntimeDomain) -> str:
    if not domain.custom_domain:
        raise ValueError(f"runtime domain {domain.host} has no custom domain")
    return domain.custom_domain
