"""A gateway's runtime domain, and the certificate of its custom domain.

The domain's step requests a certificate, then waits for the authority's signal
(``lease.wait_for``): nothing polls. Woken, it reads the certificate: Ready, it makes the
ingress and is Created; Failed, it discards it and raises, so the next attempt requests
again (past ``max_requests`` it fails); still Pending (an earlier request's signal), it
waits again. Deleting removes its ingress and certificate, then the domain.

``CertManager`` stands in for cert-manager: a certificate is a document due ``delay``
seconds after its request by the server's clock (``submit``'s ``not_before``), whose
step, on any replica or process, settles it Ready or Failed (``Faults`` decide); the next
step signals the domain, so the domain the signal wakes reads it settled.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pymongo.asynchronous.database import AsyncDatabase

from orchestrator import AsyncLease, AsyncOrchestrator, Outcome, Resource
from orchestrator.core.errors import DocumentNotFound

if TYPE_CHECKING:
    from orchestrator.demo.workflows.gateway import Faults

logger = logging.getLogger("orchestrator.demo.workflows.certificates")

CERTIFICATES = "certificates"
INGRESSES = "ingresses"
ISSUED = "certificate-issued"
"""The signal the certificate authority sends a domain when its certificate is settled."""

Recorder = Callable[[Any, str], Awaitable[None]]


class RuntimeDomain(Resource):
    collection = "runtimeDomains"
    unique = ("gateway_id",)

    gateway_id: Any
    gateway_name: str
    host: str
    custom_domain: str | None = None
    certificate_requests: int = 0  # kept across retries, unlike attempts


class Certificate(Resource):
    """A certificate request (``_id``: the custom domain), as the authority holds it."""

    collection = CERTIFICATES

    domain_id: Any
    status: str = "Pending"
    outcome: str = "Ready"
    """What the authority will settle it as."""


class CertificateFailed(RuntimeError):
    """The certificate manager gave up on a request; the next attempt asks again."""


class CertManager:
    """Certificate requests and ingresses, as the cluster would hold them."""

    def __init__(
        self,
        db: AsyncDatabase[dict[str, Any]],
        orch: AsyncOrchestrator,
        *,
        delay: float,
        faults: Faults,
        record: Recorder,
        max_requests: int = 5,
    ) -> None:
        if delay < 0:
            raise ValueError(f"certificate delay must be >= 0 s, not {delay!r}")
        self._certs = db[CERTIFICATES]
        self._ingresses = db[INGRESSES]
        self._orch = orch
        self.delay = delay
        self.timeout = max(60.0, 10 * delay)
        """How long a domain waits for its certificate before it fails."""
        self._faults = faults
        self._record = record
        self.max_requests = max_requests

    async def request(self, domain: RuntimeDomain, host: str) -> None:
        """Ask for a certificate of ``host`` (the domain's custom domain); a pending
        request is kept."""
        number = domain.certificate_requests
        fails = self._faults.should_fail(host, "certificate", number)
        cert = {"_id": host, "domainId": domain.id, "phase": "Issuing", "status": "Pending"}
        cert["outcome"] = "Failed" if fails else "Ready"
        await self._orch.submit(Certificate, cert, not_before=self.delay or None)
        logger.info("certificate requested for %s", host, extra={"doc_id": str(domain.id)})
        await self._record(domain.id, f"certificate:{number}")

    async def get(self, host: str) -> dict[str, Any] | None:
        return await self._certs.find_one({"_id": host})

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

    async def remove(self, domain: RuntimeDomain) -> None:
        """The domain's ingress and certificate, gone."""
        self._faults.check(domain.host, "delete:runtimeDomains", domain.attempts)
        await self._ingresses.delete_one({"_id": domain.host})
        if domain.custom_domain:
            await self.discard(domain.custom_domain)
        await self._record(domain.id, "delete")


def register_domains(orch: AsyncOrchestrator, certs: CertManager) -> None:
    @orch.phase(Certificate, "Issuing", to="Issued")
    async def issue(lease: AsyncLease[Certificate]) -> Outcome:
        cert = lease.resource
        if cert.status == "Pending":
            return await lease.unlock(status=cert.outcome)
        with contextlib.suppress(DocumentNotFound):  # its domain was deleted meanwhile
            await orch.signal(RuntimeDomain, cert.domain_id, ISSUED)
        return await lease.advance("Issued")

    @orch.phase(RuntimeDomain, "Creating", to=("Creating", "Created"))
    async def create_domain(lease: AsyncLease[RuntimeDomain]) -> Outcome:
        domain = lease.resource
        host = domain.custom_domain
        if host:
            cert = await certs.get(host)
            if cert is None:
                await certs.request(domain, host)
                return await lease.unlock(certificate_requests=domain.certificate_requests + 1)
            if cert["status"] == "Pending":
                return await lease.wait_for(ISSUED, then="Creating", timeout=certs.timeout)
            if cert["status"] == "Failed":
                await certs.discard(host)
                failed = f"certificate for {host} failed"
                # A step that ends well resets ``attempts``: the requests count failures.
                if domain.certificate_requests >= certs.max_requests:
                    return await lease.fail(f"{failed} {domain.certificate_requests} times")
                raise CertificateFailed(failed)
        await certs.ensure_ingress(domain)
        return await lease.advance("Created")

    @orch.phase(RuntimeDomain, "Deleting")
    async def delete_domain(lease: AsyncLease[RuntimeDomain]) -> Outcome:
        await certs.remove(lease.resource)
        return await lease.remove()
