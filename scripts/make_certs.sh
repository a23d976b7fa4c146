#!/usr/bin/env bash
# Self-signed TLS certificates for securefed-on-Flower TRIALS (not for production: use your CA).
#
#   scripts/make_certs.sh OUT_DIR [SERVER_NAME ...]
#
# Writes OUT_DIR/ca.crt, ca.key (a throw-away CA), server.pem, server.key (the SuperLink's certificate,
# signed by that CA, with every SERVER_NAME as subjectAltName; default: localhost 127.0.0.1).
# Give ca.crt to every site (flower-supernode --root-certificates ca.crt) and to whoever runs `flwr run`;
# keep ca.key and server.key on the SuperLink host only (mode 600).
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 OUT_DIR [SERVER_NAME ...]   (default names: localhost 127.0.0.1)" >&2
  exit 2
fi
command -v openssl >/dev/null || { echo "error: openssl not found; install it (apt-get install openssl)" >&2; exit 2; }
out=$1; shift
names=("$@")
[ ${#names[@]} -eq 0 ] && names=(localhost 127.0.0.1)
mkdir -p "$out"
umask 077
san=""
i=1; j=1
for n in "${names[@]}"; do
  if [[ $n =~ ^[0-9.]+$ || $n == *:* ]]; then san+="IP.$i = $n"$'\n'; i=$((i+1))
  else san+="DNS.$j = $n"$'\n'; j=$((j+1)); fi
done
cat > "$out/server.cnf" <<CNF
[req]
distinguished_name = dn
prompt = no
[dn]
CN = ${names[0]}
[ext]
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = @alt
[alt]
$san
CNF
openssl req -x509 -newkey rsa:3072 -sha256 -days 30 -nodes -keyout "$out/ca.key" -out "$out/ca.crt" \
  -subj "/CN=securefed trial CA" -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
openssl req -newkey rsa:3072 -sha256 -nodes -keyout "$out/server.key" -out "$out/server.csr" -config "$out/server.cnf" 2>/dev/null
openssl x509 -req -in "$out/server.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial -days 30 -sha256 \
  -extfile "$out/server.cnf" -extensions ext -out "$out/server.pem" 2>/dev/null
rm -f "$out/server.csr" "$out/ca.srl"
chmod 644 "$out/ca.crt" "$out/server.pem"
openssl verify -CAfile "$out/ca.crt" "$out/server.pem" >/dev/null
echo "wrote $out/ca.crt $out/server.pem $out/server.key (names: ${names[*]})"
