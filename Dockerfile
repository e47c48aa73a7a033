# One image for every Paver service: `paver run <service>`.
FROM node:20-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
COPY bin ./bin
COPY scripts ./scripts
COPY tsconfig.json tsconfig.build.json ./
COPY client ./client
COPY cli ./cli
COPY shared ./shared
COPY schemas ./schemas
COPY services ./services
COPY deploy ./deploy
COPY bench ./bench
COPY testkit ./testkit
COPY examples ./examples
RUN npm ci && npm prune --omit=dev

FROM node:20-bookworm-slim
WORKDIR /app
ENV NODE_ENV=production
COPY --from=build /app /app
USER node
ENTRYPOINT ["node", "bin/paver.js"]
