//! A dropped context's VkDevice is kept and reused by the next context on the same device, never
//! destroyed (issue 21: NVIDIA's driver deadlocks in vkDestroyDevice under concurrency). The test runs
//! in a child process of its own, so that no other test opens devices meanwhile.

use crate::common;

use common::disk::{child, child_role};
use common::drivers::{test_config, vulkan_device};
use kpc::Context;
use kpc::admin::vulkan::devices_created;

#[test]
fn dropped_contexts_leave_their_device_to_the_next() {
    let test = "dropped_contexts_leave_their_device_to_the_next";
    let Some(d) = vulkan_device(test) else {
        return;
    };
    if child_role().as_deref() != Some("reuse") {
        let out = child(test, "reuse").output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("REUSE CHECKED"),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let before = devices_created();
    let image = kpc::kernels::spirv_image("saxpy").unwrap();
    for round in 0..3 {
        let ctx = Context::builder()
            .device(&d)
            .config(test_config())
            .build()
            .unwrap();
        // Used, so that the kept device carries spare fences and pools into the next round.
        let k = ctx.kernel(&image, "saxpy").unwrap();
        let x = ctx.buffer_from(&[1.0f32, 2.0, 3.0]).unwrap();
        let y = ctx.buffer_from(&[10.0f32, 20.0, 30.0]).unwrap();
        let out = ctx.buffer_from(&[0.0f32; 3]).unwrap();
        let push = kpc::PushConstants::new().u32(3).f32(2.0);
        ctx.queue()
            .launch(&k, [1, 1, 1], &[&x, &y, &out], push.as_bytes())
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(out.read().unwrap(), vec![12.0, 24.0, 36.0], "round {round}");
        assert_eq!(devices_created() - before, 1, "round {round}");
    }
    // Two at once need two devices; both are kept afterwards.
    let a = Context::builder()
        .device(&d)
        .config(test_config())
        .build()
        .unwrap();
    let b = Context::builder()
        .device(&d)
        .config(test_config())
        .build()
        .unwrap();
    assert_eq!(devices_created() - before, 2);
    drop((a, b));
    let _c = Context::builder()
        .device(&d)
        .config(test_config())
        .build()
        .unwrap();
    let _d = Context::builder()
        .device(&d)
        .config(test_config())
        .build()
        .unwrap();
    assert_eq!(devices_created() - before, 2);
    println!("REUSE CHECKED");
}
