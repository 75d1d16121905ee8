from django.db import models


class Order(models.Model):
    email = models.EmailField()
    total_cents = models.PositiveIntegerField()
    #: The id of the task that sends the receipt (a pgfleet job id).
    receipt_task = models.CharField(max_length=64, blank=True)
    #: How many receipts were sent: the task's effect, exactly once per order.
    receipts_sent = models.PositiveIntegerField(default=0)
