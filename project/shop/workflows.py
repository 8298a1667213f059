"""The example: an order is priced, charged (with a retry), packed, held for a cooling-off
period, approved by a person (a signal) and shipped."""

import durable
from durable import Retry


@durable.step(local=True)
def price(order: dict) -> int:
    """Runs inside the workflow turn: no broker hop for pure computation."""
    return sum(item["cents"] * item["qty"] for item in order["items"])


@durable.step(retry=Retry(max_attempts=3, initial="200ms", backoff=2.0), timeout="30s")
def charge_card(order_id: int, cents: int) -> str:
    info = durable.step_info()
    if info.attempt == 1:
        # The first attempt always fails here, to show a durable retry with backoff.
        raise ConnectionError("payment provider timed out (simulated)")
    return f"ch_{info.idempotency_key.replace(':', '_')}"


@durable.step(heartbeat_timeout="30s")
def pack(order_id: int, items: list) -> dict:
    for done, item in enumerate(items, start=1):
        durable.heartbeat(progress={"packed": done, "of": len(items), "sku": item["sku"]})
    return {"parcels": 1, "weight_g": 250 * sum(item["qty"] for item in items)}


@durable.step
def ship(order_id: int, address: str) -> str:
    return f"TRACK-{order_id}-{address.split(',')[-1].strip().upper()}"


@durable.workflow(name="shop.fulfil")
def fulfil(ctx: durable.Context, order: dict) -> dict:
    cents = ctx.step(price, order)
    charge = ctx.step(charge_card, order["id"], cents)
    parcel = ctx.step(pack, order["id"], order["items"])
    ctx.sleep(order.get("cooling_off", "2s"))
    approval = ctx.wait_for_signal("approve", timeout="1h")
    tracking = ctx.step(ship, order["id"], approval["address"])
    ctx.logger.info("order %s shipped as %s", order["id"], tracking)
    return {"cents": cents, "charge": charge, "parcel": parcel, "tracking": tracking}


@durable.workflow(name="shop.quote")
def quote(ctx: durable.Context, order: dict) -> dict:
    """Price an order on a worker: what the async view ``views.quote_order`` starts and awaits."""
    return {"order": order["id"], "cents": ctx.step(price, order)}


@durable.step
def reserve_stock(sku: str, qty: int) -> str:
    if qty <= 0:
        raise durable.ApplicationError(f"cannot hold {qty} of {sku}", code="bad_quantity", non_retryable=True)
    return f"hold-{sku}-{qty}"


@reserve_stock.compensation
def release_stock(hold: str, sku: str, qty: int) -> None:
    """The saga undo: runs if the order fails after the stock was held."""


@durable.step
def print_label(item: dict) -> str:
    return f"LABEL-{item['sku'].upper()}x{item['qty']}"


@durable.workflow(name="shop.send_invoice")
def send_invoice(ctx: durable.Context, invoice: dict) -> str:
    number = f"INV-{invoice['order']}"
    ctx.step(charge_card, invoice["order"], invoice["cents"])
    return number


@durable.workflow(name="shop.wholesale")
def wholesale(ctx: durable.Context, order: dict) -> dict:
    """A bulk order: hold stock per item (undone if anything fails), print every label in
    parallel (a fan), and invoice in a child workflow."""
    holds = ctx.all([ctx.defer(reserve_stock, item["sku"], item["qty"]) for item in order["items"]])
    labels = ctx.map(print_label, order["items"])
    cents = ctx.step(price, order)
    invoice = ctx.child(send_invoice, {"order": order["id"], "cents": cents})
    return {"holds": holds, "labels": labels, "invoice": invoice}


@durable.entity("shop.stock")
class Stock:
    """The units of one SKU (the key): restocked from views, held and released by orders, one op
    at a time per SKU, each exactly once."""

    def initial_state(self) -> dict:
        return {"on_hand": 0, "held": 0}

    def restock(self, state: dict, qty: int) -> int:
        state["on_hand"] += qty
        return state["on_hand"] - state["held"]

    def hold(self, state: dict, qty: int) -> int:
        available = state["on_hand"] - state["held"]
        if qty > available:
            # Raising leaves the state as it was; the caller's call_entity raises StepFailed.
            raise durable.ApplicationError(f"only {available} {self.entity_key} left", code="out_of_stock")
        state["held"] += qty
        return available - qty

    def release(self, state: dict, qty: int) -> int:
        state["held"] -= qty
        return state["on_hand"] - state["held"]


@durable.workflow(name="shop.hold_order")
def hold_order(ctx: durable.Context, order: dict) -> dict:
    """Hold every item of an order, or none: a hold that fails releases the ones taken."""
    held = []
    for item in order["items"]:
        try:
            ctx.call_entity("shop.stock", item["sku"], "hold", item["qty"])
        except durable.StepFailed as exc:
            for sku, qty in held:
                ctx.signal_entity("shop.stock", sku, "release", qty)
            return {"held": False, "reason": exc.message}
        held.append((item["sku"], item["qty"]))
    return {"held": True}


#: The stages a parcel goes through, each scanned by ``scan_parcel``.
STAGES = ("picked", "packed", "handed to the carrier", "out for delivery", "delivered")


@durable.step
def scan_parcel(order_id: int, stage: str) -> str:
    """A scanner at one stage: its reading goes out on the run's stream as soon as it is taken."""
    durable.write_stream("tracking", {"order": order_id, "stage": stage})
    return f"{order_id}:{stage}"


@durable.workflow(name="shop.track")
def track(ctx: durable.Context, order_id: int) -> list:
    """Follow a parcel: what the page ``views.track_page`` shows live, value by value."""
    scans = []
    for stage in STAGES:
        scans.append(ctx.step(scan_parcel, order_id, stage))
        if stage != STAGES[-1]:
            ctx.sleep("1s")  # the parcel travels
    ctx.write_stream("tracking", {"order": order_id, "stage": "done", "scans": len(scans)})
    ctx.close_stream("tracking")
    return scans
