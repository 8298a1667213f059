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
