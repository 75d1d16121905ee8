"""Place an order and enqueue its receipt in the same transaction."""

import json

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from orders.models import Order
from orders.tasks import send_receipt


@csrf_exempt
@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    body = json.loads(request.body)
    with transaction.atomic():
        order = Order.objects.create(email=body["email"], total_cents=body["total_cents"])
        # Written in this transaction: no order, no receipt; no receipt, no order.
        result = send_receipt.enqueue(order.pk)
        order.receipt_task = result.id
        order.save(update_fields=["receipt_task"])
    return JsonResponse({"order": order.pk, "task": result.id}, status=201)


@require_GET
def order_status(request: HttpRequest, order_id: int) -> JsonResponse:
    order = Order.objects.get(pk=order_id)
    result = send_receipt.get_result(order.receipt_task)
    return JsonResponse(
        {
            "order": order.pk,
            "receipts_sent": order.receipts_sent,
            "task_status": result.status,
            "attempts": result.attempts,
        }
    )
