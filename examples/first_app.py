"""Invoices charged, then e-mailed: the tutorial's first app (docs/tutorial/first-app.md)."""

import os

from pymongo import MongoClient

from orchestrator import Lease, Orchestrator, Resource
from orchestrator.testing import memory_database


class Invoice(Resource):
    collection = "invoices"
    unique = ("number",)  # submit is idempotent on it; the operators' tools find by it
    number: str
    amount: int


uri = os.environ.get("MONGODB_URI")  # a real server if given, else the in-memory store
db = MongoClient(uri)["orchestrator"] if uri else memory_database()
orch = Orchestrator(db, lock_timeout=30, tick=1.0)


@orch.phase(Invoice, "Charging", to="Emailing")
def charge(lease: Lease[Invoice]):
    invoice = lease.resource
    if invoice.amount <= 0:
        return lease.fail(f"nothing to charge: {invoice.amount}")
    # Idempotent: a step may run twice (a replica dies mid-step), the payment stays one.
    db.payments.update_one(
        {"_id": invoice.number}, {"$setOnInsert": {"amount": invoice.amount}}, upsert=True
    )
    return lease.advance("Emailing")


@orch.phase(Invoice, "Emailing", to="Sent")
def email(lease: Lease[Invoice]):
    db.outbox.update_one(
        {"_id": lease.resource.number}, {"$setOnInsert": {"to": "billing@example.com"}}, upsert=True
    )
    return lease.advance("Sent")


if __name__ == "__main__":
    for number, amount in (("INV-1", 120), ("INV-2", 80), ("INV-3", 0)):
        orch.submit(Invoice, {"number": number, "amount": amount, "phase": "Charging"})
    orch.run_once()  # one tick, here and now: every step that is due runs
    for invoice in db.invoices.find({}, sort=[("number", 1)]):
        why = f" ({invoice['lastError']['message']})" if "lastError" in invoice else ""
        print(f"{invoice['number']}: {invoice['phase']}{why}")
