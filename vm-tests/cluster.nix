# Two nodes of a k3s cluster (a server and an agent), each running ginx with its own client
# certificate in the group ginx:nodes, issued through the CSR API as docs/src/install.md describes, and the
# rights of packaging/kubernetes/rbac.yaml. Each node's heartbeat Lease, annotations and
# GinxHealthy condition must be visible with kubectl. No pod has to run (no images in the VMs):
# Nodes, Leases and CSRs are all API objects.
{ self }:
{ pkgs, lib, ... }:
let
  token = "ginx-vm-test-k3s-token";
  rbac = ../packaging/kubernetes/rbac.yaml;

  ginxNode =
    { config, ... }:
    {
      imports = [ (import ./common.nix self) ];
      virtualisation.diskSize = 4096;
      services.ginx = {
        settings = {
          # Stands in for colmena (no system can be built in the VM): succeeds.
          apply.command = [ "${pkgs.coreutils}/bin/true" ];
          kubernetes.kubeconfig = "/etc/ginx/kubeconfig";
          kubernetes.renew_interval = "2s";
          # No Cilium here.
          health.cilium.enabled = false;
        };
      };
      services.k3s = {
        enable = true;
        inherit token;
        extraFlags = [ "--node-ip=${config.networking.primaryIPAddress}" ];
      };
      networking.firewall.enable = false;
      system.activationScripts.hephaestus = ''
        if [ ! -d /srv/hephaestus.git ]; then
          ${pkgs.git}/bin/git init -q --bare -b main /srv/hephaestus.git
          tmp=$(mktemp -d)
          ${pkgs.git}/bin/git -C "$tmp" init -q -b main
          echo '{ }' > "$tmp/hive.nix"
          ${pkgs.git}/bin/git -C "$tmp" add hive.nix
          ${pkgs.git}/bin/git -C "$tmp" -c user.name=t -c user.email=t@example.com commit -q -m hive
          ${pkgs.git}/bin/git -C "$tmp" push -q /srv/hephaestus.git main
          rm -rf "$tmp"
        fi
      '';
    };
in
{
  name = "ginx-cluster";

  nodes.server =
    { config, ... }:
    {
      imports = [ ginxNode ];
      virtualisation.memorySize = 1536;
      # k3s (API server, controllers, its sqlite datastore) and ginx share this VM; give it two vCPUs.
      virtualisation.cores = 2;
      # kubectl is k3s's; this kubeconfig is the cluster admin's (for the test script only).
      environment.systemPackages = [ pkgs.openssl ];
      environment.variables.KUBECONFIG = "/etc/rancher/k3s/k3s.yaml";
      services.ginx.settings.node.role = "control-plane";
      services.k3s = {
        role = "server";
        extraFlags = [
          "--disable=coredns,local-storage,metrics-server,servicelb,traefik"
          "--disable-helm-controller"
          "--disable-network-policy"
          "--write-kubeconfig-mode=0600"
        ];
      };
    };

  nodes.agent =
    { nodes, ... }:
    {
      imports = [ ginxNode ];
      virtualisation.memorySize = 1024;
      services.ginx.settings.node.role = "worker";
      services.k3s = {
        role = "agent";
        serverAddr = "https://${nodes.server.networking.primaryIPAddress}:6443";
      };
    };

  testScript =
    { nodes, ... }:
    let
      api = "https://${nodes.server.networking.primaryIPAddress}:6443";
    in
    ''
      start_all()
      server.wait_for_unit("k3s.service")
      server.wait_until_succeeds("kubectl get node server")
      agent.wait_for_unit("k3s.service")
      server.wait_until_succeeds("kubectl get node agent")
      server.succeed("kubectl apply -f ${rbac}")

      def credentials(node):
          # docs/src/install.md, "Kubernetes credentials": a key, a CSR in ginx:nodes, approved, a kubeconfig.
          server.succeed(
              f"openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes"
              f" -keyout /tmp/{node}.key -subj /O=ginx:nodes/CN=ginx:{node} -out /tmp/{node}.csr",
              f"kubectl apply -f - <<CSR\n"
              f"apiVersion: certificates.k8s.io/v1\n"
              f"kind: CertificateSigningRequest\n"
              f"metadata: {{name: ginx-{node}}}\n"
              f"spec:\n"
              f"  signerName: kubernetes.io/kube-apiserver-client\n"
              f"  usages: [client auth]\n"
              f"  request: $(base64 -w0 < /tmp/{node}.csr)\n"
              f"CSR",
              f"kubectl certificate approve ginx-{node}",
          )
          server.wait_until_succeeds(f"kubectl get csr ginx-{node} -o jsonpath='{{.status.certificate}}' | grep -q .")
          server.succeed(
              f"kubectl get csr ginx-{node} -o jsonpath='{{.status.certificate}}' | base64 -d > /tmp/{node}.crt",
              "kubectl config view --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}'"
              " | base64 -d > /tmp/ca.crt",
              f"kc=/tmp/{node}.kubeconfig"
              f" && kubectl config set-cluster k3s --server=${api} --certificate-authority=/tmp/ca.crt --embed-certs --kubeconfig=$kc"
              f" && kubectl config set-credentials ginx --client-certificate=/tmp/{node}.crt --client-key=/tmp/{node}.key --embed-certs --kubeconfig=$kc"
              f" && kubectl config set-context k3s --cluster=k3s --user=ginx --kubeconfig=$kc"
              f" && kubectl config use-context k3s --kubeconfig=$kc",
          )
          return server.succeed(f"base64 -w0 /tmp/{node}.kubeconfig").strip()

      for machine, name in [(server, "server"), (agent, "agent")]:
          kc = credentials(name)
          machine.succeed(
              f"echo {kc} | base64 -d > /etc/ginx/kubeconfig.new",
              "chmod 600 /etc/ginx/kubeconfig.new",
              "mv /etc/ginx/kubeconfig.new /etc/ginx/kubeconfig",
          )
          machine.wait_for_unit("ginx.service")
          machine.succeed("ginxctl sync")

      for machine, name in [(server, "server"), (agent, "agent")]:
          rev = machine.succeed("git -C /srv/hephaestus.git rev-parse main").strip()
          with subtest(f"{name}: Lease, annotations and condition visible with kubectl"):
              server.wait_until_succeeds(
                  f"kubectl -n ginx-system get lease ginx-{name} -o jsonpath='{{.spec.holderIdentity}}' | grep -qx {name}"
              )
              server.wait_until_succeeds(
                  f"kubectl get node {name} -o json"
                  f" | jq -e '.metadata.annotations[\"ginx.io/apply-state\"] == \"succeeded\"'"
              )
              server.succeed(
                  f"kubectl get node {name} -o json | jq -e '.metadata.annotations[\"ginx.io/version\"] | length > 0'",
                  f"kubectl get node {name} -o json"
                  f" | jq -e '.metadata.annotations[\"ginx.io/applied-revision\"] == \"{rev}\"'",
              )
              server.wait_until_succeeds(
                  f"kubectl get node {name} -o json"
                  f" | jq -e '.status.conditions[] | select(.type == \"GinxHealthy\") | .status'"
              )

      with subtest("each node's status says connected"):
          for machine in [server, agent]:
              machine.wait_until_succeeds("ginxctl status --json | jq -e '.kubernetes.state == \"connected\"'")
    '';
}
