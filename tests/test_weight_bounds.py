"""Weights are bounded: MIN_WEIGHT <= w <= MAX_WEIGHT, everywhere one can be set.

Every promotion and enqueue divides by the weight: a weight of 1e-308 was accepted and then
overflowed float8 in every worker's maintenance pass. The service layer (the Python API,
the HTTP API, the admin) refuses a weight out of bounds, and the CHECK constraints refuse
it from anyone else.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, transaction

from pgqueue import services
from pgqueue.models import MAX_WEIGHT, MIN_WEIGHT, QueueWeight, Tenant
from tests.api_fixtures import assert_error, client, new_key

OUT_OF_BOUNDS = [1e-308, MIN_WEIGHT / 2, MAX_WEIGHT * 1.001, 1e300]


def test_the_bounds_are_the_services_too() -> None:
    assert (services.MIN_WEIGHT, services.MAX_WEIGHT) == (0.001, 1000.0)


@pytest.mark.django_db
@pytest.mark.parametrize("weight", [MIN_WEIGHT, 1, MAX_WEIGHT])
def test_the_bounds_themselves_are_accepted(weight: float) -> None:
    services.set_tenant_weight("acme", weight)
    services.set_tenant_weight("acme", weight, queue="q")
    assert Tenant.objects.get(name="acme").weight == weight
    assert QueueWeight.objects.get(tenant_id="acme", queue="q").weight == weight


@pytest.mark.django_db
@pytest.mark.parametrize("weight", OUT_OF_BOUNDS)
@pytest.mark.parametrize("queue", [None, "q"])
def test_python_api_refuses_a_weight_out_of_bounds(weight: float, queue: str | None) -> None:
    services.set_tenant_weight("acme", 2)
    with pytest.raises(services.InvalidJob) as exc:
        services.set_tenant_weight("acme", weight, queue=queue)
    assert exc.value.field == "weight"
    assert "0.001" in str(exc.value) and "1000" in str(exc.value)
    assert Tenant.objects.get(name="acme").weight == 2.0
    assert not QueueWeight.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("weight", OUT_OF_BOUNDS)
def test_api_answers_400_naming_the_weight(weight: float) -> None:
    api = client(new_key())
    services.set_tenant_weight("acme", 2)
    response = api.put("/tenants/acme", {"weight": weight}, format="json")
    error = assert_error(response, 400, field="weight")
    assert "weight" in error["detail"]
    assert Tenant.objects.get(name="acme").weight == 2.0


@pytest.mark.django_db
@pytest.mark.parametrize("weight", ["1e-308", "0.0005", "1000.5"])
def test_admin_form_refuses_a_weight_out_of_bounds(admin_client: Any, weight: str) -> None:
    services.set_tenant_weight("acme", 3)
    response = admin_client.post(
        "/admin/pgqueue/tenant/acme/change/", {"weight": weight, "_save": "Save"}
    )
    assert response.status_code == 200  # the form again, with the error
    assert "The weight must be from 0.001 to 1000." in response.content.decode()
    assert Tenant.objects.get(name="acme").weight == 3.0


@pytest.mark.django_db
@pytest.mark.parametrize("weight", [1e-308, 0.0009, 1000.1])
def test_the_database_refuses_a_direct_update_out_of_bounds(weight: float) -> None:
    services.set_tenant_weight("acme", 1, queue="q")
    with pytest.raises(IntegrityError, match="pgqueue_tenant_weight_range"), transaction.atomic():
        Tenant.objects.filter(name="acme").update(weight=weight)
    refused = pytest.raises(IntegrityError, match="pgqueue_queue_weight_weight_range")
    with refused, transaction.atomic():
        QueueWeight.objects.filter(tenant_id="acme").update(weight=weight)
    assert Tenant.objects.get(name="acme").weight == 1.0
