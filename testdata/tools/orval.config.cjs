// orval's fetch client, its base URL read at run time: the document's
// servers entry is "/", which Node's fetch cannot use on its own.
module.exports = {
  petstore: {
    input: "./openapi.json",
    output: {
      target: "./gen-orval/api.ts",
      client: "fetch",
      baseUrl: { runtime: "process.env.PETSTORE_URL" },
    },
  },
};
