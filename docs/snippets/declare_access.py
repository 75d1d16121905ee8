"""A new endpoint of the jobs API declares the access it needs, beside its code."""

from aiohttp import web

from pgfleet.service.api import JobsApi
from pgfleet.service.credentials import Access, requires


class MyJobsApi(JobsApi):
    def application(self) -> web.Application:
        app = super().application()
        app.router.add_get("/quotas", self.quotas)
        return app

    @requires(Access.OBSERVE)  # viewers and operators; a producer gets 403
    async def quotas(self, request: web.Request) -> web.Response:
        return web.json_response({"quotas": []})
