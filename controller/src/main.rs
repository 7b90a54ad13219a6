//! `aliaslb-controller`: entry point. The controller itself comes with the controller issue.

fn main() {
    eprintln!("aliaslb-controller: not implemented yet");
    std::process::exit(2);
}
