// A back-office script against the fetch client orval generates from the
// running service's /openapi.json (gen-orval/api.ts, made by the test),
// with its base URL from PETSTORE_URL (see orval.config.cjs).
import { createPet, listPets, getPet, listOrders, getHealth, getIndex, getOpenAPIJSON } from "./gen-orval/api.js";

const auth: RequestInit = { headers: { Authorization: `Bearer ${process.env.PETSTORE_KEY ?? ""}` } };
const out: Record<string, unknown> = {};

const created = await createPet({ name: "Rex", categoryId: 1 }, auth);
out.created = [created.status, created.data];
const listed = await listPets({ status: "available", limit: 10 }, auth);
out.listed = [listed.status, listed.data];
const got = await getPet(1, auth);
out.got = [got.status, got.data];
const bad = await createPet({ name: "", categoryId: 1 }, auth);
out.badRequest = [bad.status, bad.data];
const orders = await listOrders(auth);
out.orders = [orders.status, orders.data];
const health = await getHealth();
out.health = [health.status, health.data];
out.index = (await getIndex()).status;
// The YAML form (getOpenAPI) has no schema, and orval's client parses
// every body as JSON: it reads the document as JSON.
const doc = await getOpenAPIJSON();
out.openapi = (doc.data as { openapi?: string }).openapi;

console.log(JSON.stringify(out));
